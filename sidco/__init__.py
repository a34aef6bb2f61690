"""Front door of the SIDCo testbed: the ``sidco`` command line (the results store lives in ``results``)."""

__version__ = "0.1.0"
