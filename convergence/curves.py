"""Convergence curves as a file: what ``sidco converge --json`` writes and ``sidco tta --curves`` reads.

JSON ``{"source": TEXT, "rows": [{"compressor", "density", "iteration", "loss", "accuracy"}, ...]}``
or CSV with those columns (header first). ``compressor``: a compressor name; ``density``: in
(0, 1] (1 for ``none``, the casts and PowerSGD, which may also leave it empty or null);
``iteration``: from 1; ``loss``: training loss
(nats); ``accuracy``: held-out accuracy (a fraction in [0, 1]) or null/empty on iterations not
evaluated. Optional columns: ``eval_loss`` (held-out loss, nats; needed by ``--target-loss``)
and ``seed`` (an integer: rows of different seeds are separate runs of the same pair; default 0).
A user's own training (e.g. a DDP job with ``compressors.ddp.comm_hook``) writes the same rows.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compressors import names, takes_density
from traces.files import read_regular
from units import check_density

COLUMNS = ("compressor", "density", "iteration", "loss", "accuracy")
"""The columns every row has."""
OPTIONAL = ("eval_loss", "seed")
"""Columns a row may have."""
MAX_BYTES = 64 * 1024 * 1024
"""Largest curves file read (bytes)."""


def _number(row: Mapping[str, Any], key: str, where: str, *, optional: bool = False) -> float | None:
    value = row.get(key)
    if value is None or value == "":
        if optional:
            return None
        raise ValueError(f"{where}: {key} is missing")
    if isinstance(value, bool):
        raise ValueError(f"{where}: {key} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {key} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{where}: {key} must be finite, got {value!r}")
    return number


def _integer(row: Mapping[str, Any], key: str, where: str, *, optional: bool = False) -> int | None:
    number = _number(row, key, where, optional=optional)
    if number is None:
        return None
    if number != int(number):
        raise ValueError(f"{where}: {key} must be an integer, got {row[key]!r}")
    return int(number)


def check_row(row: Any, where: str) -> dict[str, Any]:
    """One row, checked and normalised (numbers as float/int, missing optional columns ``None``/0);
    ``ValueError`` naming ``where`` and the first bad field."""
    if not isinstance(row, Mapping):
        raise ValueError(f"{where}: a row must be an object with {', '.join(COLUMNS)}")
    compressor = row.get("compressor")
    if not isinstance(compressor, str) or not compressor:
        raise ValueError(f"{where}: compressor must be a name, got {compressor!r}")
    if row.get("density") in (None, "") and compressor in names() and not takes_density(compressor):
        density = 1.0
    else:
        density = check_density(_number(row, "density", where), f"{where}: density")
    iteration = _integer(row, "iteration", where)
    if iteration < 1:
        raise ValueError(f"{where}: iteration must be >= 1, got {iteration}")
    accuracy = _number(row, "accuracy", where, optional=True)
    if accuracy is not None and not 0 <= accuracy <= 1:
        raise ValueError(f"{where}: accuracy must be a fraction in [0, 1], got {accuracy:g}")
    eval_loss = _number(row, "eval_loss", where, optional=True)
    if eval_loss is not None and eval_loss < 0:
        raise ValueError(f"{where}: eval_loss must be >= 0, got {eval_loss:g}")
    seed = _integer(row, "seed", where, optional=True)
    return {"compressor": compressor, "density": density, "iteration": iteration,
            "loss": _number(row, "loss", where), "accuracy": accuracy, "eval_loss": eval_loss,
            "seed": 0 if seed is None else seed}


def parse(text: str, name: str = "curves") -> dict[str, Any]:
    """``{"source", "rows"}`` from JSON or CSV ``text`` (JSON when it starts with ``{``), rows
    checked by :func:`check_row`; ``ValueError`` naming ``name`` and what is wrong."""
    if text.lstrip().startswith("{"):
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(document, dict) or not isinstance(document.get("rows"), list):
            raise ValueError(f'{name}: expected {{"source": TEXT, "rows": [...]}}')
        source, rows = document.get("source"), document["rows"]
        if source is not None and not isinstance(source, str):
            raise ValueError(f"{name}: source must be text, got {source!r}")
    else:
        try:
            reader = csv.DictReader(io.StringIO(text, newline=""))
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise ValueError(f"{name}: a CSV needs the columns {', '.join(COLUMNS)}; missing {', '.join(missing)}")
            source, rows = None, list(reader)
        except csv.Error as exc:
            raise ValueError(f"{name}: not valid CSV (line {reader.line_num}: {exc})") from None
    if not rows:
        raise ValueError(f"{name}: no rows")
    checked = [check_row(row, f"{name} row {i + 1}") for i, row in enumerate(rows)]
    seen = set()
    for row in checked:
        key = (row["compressor"], row["density"], row["seed"], row["iteration"])
        if key in seen:
            raise ValueError(f"{name}: iteration {key[3]} of {key[0]} at density {key[1]:g} (seed {key[2]}) "
                             "appears twice")
        seen.add(key)
    if not any(r["accuracy"] is not None or r["eval_loss"] is not None for r in checked):
        raise ValueError(f"{name}: no row has a held-out accuracy or eval_loss")
    return {"source": source or name, "rows": checked}


def load(path: str | Path) -> dict[str, Any]:
    """Read a curves file (JSON or CSV, at most :data:`MAX_BYTES`); ``ValueError`` (one line) when
    it is missing, too large, not UTF-8 or malformed."""
    path = Path(path)
    try:
        text = read_regular(path, MAX_BYTES, "curves file").decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text (JSON or CSV)") from None
    return parse(text, str(path))


def document(source: str, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The JSON document of ``rows`` (convergence rows) named by ``source``: every column of
    :data:`COLUMNS` and :data:`OPTIONAL` each row has, in that order."""
    keys = COLUMNS + OPTIONAL
    return {"source": source, "rows": [{k: row[k] for k in keys if k in row} for row in rows]}
