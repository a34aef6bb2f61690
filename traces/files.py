"""Reading a file a user names (a profile, a curves file, a text corpus): a regular file only,
never more than a stated number of bytes.

A FIFO, a device (``/dev/zero``), a directory or a socket is refused before anything is read,
so reading can neither block nor run without end; a file that grows while it is read is cut one
byte past the limit. Every problem is one ``ValueError`` line naming the file.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in words (``a FIFO``, ``a device``, ...), from
    its ``st_mode``."""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "a socket" if stat.S_ISSOCK(mode) else "not a regular file"


def read_regular(path: str | Path, max_bytes: int, what: str) -> bytes:
    """The bytes of the regular file at ``path`` (never followed through a symbolic link, as trace
    files are not), at most ``max_bytes`` of them; ``what`` names
    the file's role in the errors (``"cannot read profile P: a FIFO; a profile must be a regular
    file"``, ``"… N bytes, more than the M bytes a profile may hold"``)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP and path.is_symlink():
            raise ValueError(f"cannot read {what} {path}: a symbolic link; a {what} must be a regular file "
                             "(give the path of the file it points to)") from None
        if exc.errno == errno.ENXIO:  # a socket
            raise ValueError(f"cannot read {what} {path}: a socket; a {what} must be a regular file") from None
        raise ValueError(f"cannot read {what} {path}: {(exc.strerror or str(exc)).lower()}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"cannot read {what} {path}: {file_kind(info.st_mode)}; a {what} must be a regular file")
        if info.st_size > max_bytes:
            raise ValueError(f"cannot read {what} {path}: {info.st_size} bytes, more than the "
                             f"{max_bytes} bytes a {what} may hold")
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:  # the file may grow after fstat: read one byte past the limit at most
            chunk = os.read(fd, max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path}: {(exc.strerror or str(exc)).lower()}") from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise ValueError(f"cannot read {what} {path}: more than the {max_bytes} bytes a {what} may hold")
    return b"".join(chunks)
