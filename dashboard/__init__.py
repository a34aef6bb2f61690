"""The what-if dashboard: a Dash app over the results store.

>>> from dashboard import create_app
>>> app = create_app("runs/results.sqlite")   # doctest: +SKIP
>>> app.run(host="127.0.0.1", port=8050)      # doctest: +SKIP
"""

from dashboard.app import create_app

__all__ = ["create_app"]
