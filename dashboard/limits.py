"""What the dashboard's server accepts and how much it computes at once.

- Every text a page sends (a control's value, the address's query) is at most
  :data:`INPUT_MAX_CHARS` characters, a callback request at most :data:`REQUEST_MAX_BYTES` bytes:
  a longer one is refused (HTTP 413, one line) before any callback sees it, so it is never
  echoed into a page. The text controls take no more in the browser either (``maxLength``).
- At most :data:`WORK_SLOTS` callbacks compute at once; the others wait their turn without
  competing for the interpreter, so pages and assets (``GET /``) are served at once however many
  projections are asked for.
- The server's request log cuts any line longer than :data:`LOG_MAX_CHARS` characters.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

from flask import Flask, Response, request

INPUT_MAX_CHARS = 1000
"""The most characters of one text a page may send (a control's value, the address's query)."""
REQUEST_MAX_BYTES = 16 * 2**20
"""The most bytes of one callback request (its body holds a figure when it is downloaded)."""
WORK_SLOTS = max(2, min(4, os.cpu_count() or 1))
"""How many callbacks compute at once: one per CPU, at least 2 (a slow detailed simulation leaves
the other pages served) and at most 4."""
LOG_MAX_CHARS = 300
"""The most characters of one line of the server's request log."""
CALLBACK_PATH = "/_dash-update-component"
UNCHECKED = ("figure",)
"""Properties a page sends back that the server made (a figure to download), not typed text."""


def oversized(body: dict[str, Any]) -> str | None:
    """Why the callback request ``body`` (Dash's JSON: ``inputs`` and ``state``, each a list of
    ``{"id", "property", "value"}``, nested lists for pattern-matching ids) is refused: the
    property of the first text over :data:`INPUT_MAX_CHARS` characters, or ``None`` if none is."""
    def items(entries: Any):
        for entry in entries or ():
            if isinstance(entry, list):
                yield from items(entry)
            elif isinstance(entry, dict):
                yield entry

    def too_long(value: Any) -> bool:
        if isinstance(value, str):
            return len(value) > INPUT_MAX_CHARS
        if isinstance(value, list):
            return any(too_long(v) for v in value)
        if isinstance(value, dict):
            return any(too_long(v) for v in value.values())
        return False

    for entry in items([*(body.get("inputs") or ()), *(body.get("state") or ())]):
        if entry.get("property") not in UNCHECKED and too_long(entry.get("value")):
            return f"{entry.get('property')} of {json.dumps(entry.get('id'))[:80]}"
    return None


def _refuse(reason: str) -> Response:
    return Response(reason + "\n", status=413, mimetype="text/plain")


class _ShortLines(logging.Filter):
    """Cuts a log record's message to :data:`LOG_MAX_CHARS` characters (a request line with a long query)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if len(message) > LOG_MAX_CHARS:
            record.msg, record.args = f"{message[:LOG_MAX_CHARS]}… ({len(message)} characters)", ()
        return True


def install(server: Flask, slots: int | None = None) -> None:
    """Apply the limits to the dashboard's Flask ``server``: refuse oversized callback requests and
    queries (HTTP 413), run at most ``slots`` (default :data:`WORK_SLOTS`) callbacks at once, and
    shorten long request-log lines."""
    server.config["MAX_CONTENT_LENGTH"] = REQUEST_MAX_BYTES
    work = threading.BoundedSemaphore(slots or WORK_SLOTS)
    held = threading.local()

    @server.before_request
    def _check():
        if len(request.query_string) > INPUT_MAX_CHARS:
            return _refuse(f"address query over {INPUT_MAX_CHARS} characters refused")
        if request.path != CALLBACK_PATH or request.method != "POST":
            return None
        if (request.content_length or 0) > REQUEST_MAX_BYTES:
            return _refuse(f"callback request over {REQUEST_MAX_BYTES} bytes refused")
        reason = oversized(request.get_json(silent=True) or {})
        if reason:
            return _refuse(f"{reason}: over {INPUT_MAX_CHARS} characters, refused")
        work.acquire()
        held.slot = True
        return None

    @server.teardown_request
    def _release(_exc):
        if getattr(held, "slot", False):
            held.slot = False
            work.release()

    log = logging.getLogger("werkzeug")
    if not any(isinstance(f, _ShortLines) for f in log.filters):
        log.addFilter(_ShortLines())
