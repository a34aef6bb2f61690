"""Compression costs per compressor and density, fitted from measured rows.

Nothing here times a compressor: the rows come from a replay (:mod:`traces.replay`, the
one measuring code) or a stored device profile, and :func:`pipeline.costs.compression_profile`
decides which.

A :class:`CompressionProfile` answers: for a bucket of ``numel`` elements on worker
``w``, how long does compression take (s), how long one decompression (s), and how
many bytes go on the wire. Times follow a linear model ``t = t0 + t1·numel`` fitted by
least squares over the replay rows (with a single bucket size, ``t0 = 0`` and
``t1 = Σt/Σnumel``); wire bytes are ``bytes_per_element[w] · numel`` per worker, which
keeps the variable k of each worker (worker ``w`` of a bigger cluster uses the replay's
worker ``w mod workers``).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from units import Pair


def density_key(density: float | None) -> float | None:
    """Canonical density used as a lookup key (6 significant digits)."""
    return None if density is None else float(f"{float(density):.6g}")


@dataclass(frozen=True)
class CompressionCost:
    """Costs of one (compressor, density): times in s, ``wire_per_element`` in bytes/element per worker;
    ``source`` says where they come from (e.g. "replay #3 cpu 2026-12-01", "file costs.json")."""

    compress_fixed_s: float
    compress_per_element_s: float
    decompress_fixed_s: float
    decompress_per_element_s: float
    wire_per_element: tuple[float, ...]
    source: str = ""

    def compress_s(self, numel: float) -> float:
        """Seconds to compress ``numel`` elements."""
        return self.compress_fixed_s + self.compress_per_element_s * numel

    def decompress_s(self, numel: float) -> float:
        """Seconds to decompress one message of a ``numel``-element tensor."""
        return self.decompress_fixed_s + self.decompress_per_element_s * numel

    def wire_bytes(self, numel: float, workers: int) -> np.ndarray:
        """Bytes on the wire of each of ``workers`` workers for a ``numel``-element bucket."""
        per = np.asarray(self.wire_per_element, dtype=float)
        return per[np.arange(workers) % len(per)] * numel


def _fit(numel: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """Least-squares ``t = t0 + t1·numel`` with t0, t1 ≥ 0 (rate only when one size was seen)."""
    if len(np.unique(numel)) >= 2:
        t1, t0 = np.polyfit(numel, seconds, 1)
        if t0 >= 0 and t1 >= 0:
            return float(t0), float(t1)
    return 0.0, float(seconds.sum() / max(numel.sum(), 1))


@dataclass(frozen=True)
class CompressionProfile:
    """Costs keyed by ``(compressor, density_key(density))``; ``source`` says where they came from."""

    costs: Mapping[tuple[str, float | None], CompressionCost] = field(default_factory=dict)
    source: str = ""

    def cost(self, compressor: str, density: float | None) -> CompressionCost:
        """The costs of ``compressor`` at ``density``; ValueError when they were not measured."""
        key = (compressor, density_key(density))
        if key not in self.costs:
            have = ", ".join(Pair(c, d).label for c, d in sorted(self.costs, key=str) if d is not None) or "none"
            raise ValueError(f"no compression profile for {compressor} at density {density}; profiled: {have}")
        return self.costs[key]

    def pairs(self) -> list[tuple[str, float | None]]:
        """The (compressor, density) pairs this profile covers."""
        return sorted(self.costs, key=str)

    def to_json(self) -> str:
        """The profile as JSON (see :meth:`from_json`)."""
        return json.dumps({
            "source": self.source,
            "costs": [
                {"compressor": c, "density": d, **asdict(cost)} for (c, d), cost in sorted(self.costs.items(), key=str)
            ],
        }, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CompressionProfile:
        """Rebuild a profile written by :meth:`to_json`."""
        data = json.loads(text)
        costs = {}
        for item in data["costs"]:
            key = (item.pop("compressor"), density_key(item.pop("density")))
            item["wire_per_element"] = tuple(item["wire_per_element"])
            costs[key] = CompressionCost(**item)
        return cls(costs, data["source"])

    @classmethod
    def from_replay_rows(cls, rows: Iterable[Mapping[str, Any]], source: str = "replay") -> CompressionProfile:
        """Fit costs from replay rows (dicts with the ``replay_rows`` columns ``compressor``,
        ``density``, ``error_feedback``, ``worker``, ``numel``, ``compress_s``, ``decompress_s``,
        ``wire_bytes``); every cost gets ``source``.

        Rows with error feedback are preferred where both kinds exist (training uses it).
        """
        groups: dict[tuple[str, float | None, int], list[tuple[int, int, float, float, int]]] = defaultdict(list)
        for row in rows:
            key = (str(row["compressor"]), density_key(row["density"]), int(bool(row["error_feedback"])))
            groups[key].append(
                (int(row["worker"]), int(row["numel"]), float(row["compress_s"]), float(row["decompress_s"]),
                 int(row["wire_bytes"]))
            )
        costs: dict[tuple[str, float | None], CompressionCost] = {}
        for (name, density, ef), items in sorted(groups.items(), key=str):
            if (name, density, 1 - ef) in groups and ef == 0:
                continue
            arr = np.asarray(items, dtype=float)
            workers, numel, comp, decomp, wire = arr.T
            c0, c1 = _fit(numel, comp)
            d0, d1 = _fit(numel, decomp)
            per_worker = tuple(
                float(wire[workers == w].sum() / numel[workers == w].sum()) for w in np.unique(workers)
            )
            costs[(name, density)] = CompressionCost(c0, c1, d0, d1, per_worker, source)
        if not costs:
            raise ValueError("no replay rows to build a compression profile from")
        return cls(costs, source)
