"""The one error type of the traces package."""

from __future__ import annotations


class TraceError(ValueError):
    """A trace is missing, malformed or inconsistent.

    The message is one line that names the offending file and the problem, so the
    ``sidco`` command line can print it as is (exit code 2).
    """
