"""Store errors as one line naming the file and the fix.

SQLite reports a damaged, foreign, read-only or full database with terse messages
(``file is not a database``, ``attempt to write a readonly database``, ``database or disk
is full``) and Python adds a traceback. :func:`translate` turns those, and the OS errors
of creating the store's directory, into a :class:`StoreError` whose message says which
file, what is wrong and what to do. Rows committed before the error stay valid: every
write is one transaction, rolled back when it fails.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path


SQLITE_PATH_LIMIT = 512
"""The longest absolute path, in bytes, SQLite's Unix layer opens (its ``mxPathname``)."""


class StoreError(OSError):
    """The results store cannot be opened, read or written; ``str()`` is one line with the fix."""


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False


def _file_in_the_way(directory: Path) -> Path | None:
    """The nearest existing ancestor of ``directory`` (itself included) when it is not a directory."""
    for candidate in (directory, *directory.parents):
        if candidate.exists():
            return None if candidate.is_dir() else candidate
    return None


def translate(path: Path, exc: BaseException) -> StoreError:
    """A :class:`StoreError` for ``exc`` raised while using the store at ``path``."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    low = text.lower()
    other = "or pass another --store"
    if _is_dir(path):
        message = f"{path} is a directory, not a results store: pass another --store, a file path such as {path / 'results.sqlite'}"
    elif isinstance(exc, OSError) and exc.errno == errno.ENOSPC or "full" in low:
        message = (f"{path}: the disk is full; free space on {path.parent or '.'} and rerun "
                   "(rows already stored are kept)")
    elif "not a database" in low:
        message = f"{path} is not a results store (not an SQLite database): move it away {other}"
    elif "malformed" in low or "corrupt" in low:
        message = f"{path} is damaged (truncated or corrupt): restore it from a copy, move it away {other}"
    elif "readonly" in low or "read-only" in low or (isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS)):
        message = (f"{path} is read-only (the file or its directory {path.parent}): make both writable {other}")
    elif "duplicate column" in low or "already exists" in low or "no such table" in low or "no such column" in low:
        message = (f"{path} is damaged: its tables do not match the schema version it records ({text}); "
                   f"restore it from a copy, move it away {other}")
    elif "unable to open" in low or isinstance(exc, OSError):
        blocker = _file_in_the_way(path.parent)
        length = len(os.fsencode(os.path.abspath(path)))
        if length > SQLITE_PATH_LIMIT:
            message = (f"cannot open the results store {path}: its absolute path is {length} bytes long, over "
                       f"SQLite's limit of {SQLITE_PATH_LIMIT}; pass a shorter --store")
        elif blocker is not None:
            message = f"cannot create {path}: {blocker} is a file, not a directory; {other.removeprefix('or ')}"
        else:
            message = f"cannot open the results store {path} ({text}): make {path.parent} a writable directory {other}"
    elif "locked" in low or "busy" in low:
        message = f"{path} is locked by another process for too long: wait for it to finish and rerun"
    else:
        message = f"{path}: {text}"
    return StoreError(message)


def guard(path: Path):
    """Context manager turning SQLite and OS errors inside it into :class:`StoreError`."""
    return _Guard(path)


class _Guard:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is None or isinstance(exc, StoreError) or isinstance(exc, sqlite3.IntegrityError):
            return False
        if isinstance(exc, (sqlite3.DatabaseError, OSError)):
            raise translate(self.path, exc) from exc
        return False
