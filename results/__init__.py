"""The results store: one SQLite file every part of the testbed writes to and reads from.

This package sits at the bottom of the house: it imports nothing else from the project, so
compressors, traces, the simulator, emulation, the orchestration layer, the CLI and the
dashboard can all depend on it.
"""

from results.errors import StoreError
from results.store import DEFAULT_PATH, MAX_ROW_ID, SCHEMA_VERSION, Store, config_key, row_id

__all__ = ["DEFAULT_PATH", "MAX_ROW_ID", "SCHEMA_VERSION", "Store", "StoreError", "config_key", "row_id"]
