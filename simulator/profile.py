"""Compression costs per compressor and density, fitted from replay results.

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
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


def density_key(density: float | None) -> float | None:
    """Canonical density used as a lookup key (6 significant digits)."""
    return None if density is None else float(f"{float(density):.6g}")


@dataclass(frozen=True)
class CompressionCost:
    """Costs of one (compressor, density): times in s, ``wire_per_element`` in bytes/element per worker."""

    compress_fixed_s: float
    compress_per_element_s: float
    decompress_fixed_s: float
    decompress_per_element_s: float
    wire_per_element: tuple[float, ...]

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
            have = ", ".join(f"{c}@{d:g}" for c, d in sorted(self.costs, key=str) if d is not None) or "none"
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
        """Fit costs from replay rows (dicts or sqlite rows with the ``replay_rows`` columns).

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
            costs[(name, density)] = CompressionCost(c0, c1, d0, d1, per_worker)
        if not costs:
            raise ValueError("no replay rows to build a compression profile from")
        return cls(costs, source)

    @classmethod
    def from_trace(
        cls,
        trace: Any,
        compressors: Sequence[str],
        densities: Sequence[float],
        *,
        device: str = "cpu",
        iterations: int = 2,
    ) -> CompressionProfile:
        """Measure costs by running ``compressors`` (with error feedback) at ``densities`` on
        the first ``iterations`` iterations of every worker of ``trace`` (one whole-model
        bucket per call), timing compress and decompress on ``device``; used when no replay
        results exist. The first call of each compressor is a warm-up and not recorded.
        PowerSGD runs at rank 1 with the trace's layer shapes (when it has no matrices, e.g. a
        synthetic 1-D trace, as one square matrix, so its matrix products are timed)."""
        import compressors as comp

        names = [c for c in compressors if c != "none"]
        if not names:
            return cls({}, "none")
        used = list(trace.iterations[: max(1, iterations)])
        grads = {(it, w): trace.gradient(it, w).to(device) for it in used for w in range(trace.workers)}
        rows = []
        shapes = [tuple(shape) for _, shape in trace.layers]
        matrices = any(len(shape) >= 2 for shape in shapes)
        for name in names:
            options = {"shapes": shapes} if comp.message_kind(name) == "lowrank" and matrices else {}
            for density in densities:
                ef = comp.ErrorFeedback(comp.create(name, density=density, **options))
                ef.compress(grads[(used[0], 0)].clone(), key="warm-up")
                for (it, w), grad in grads.items():
                    t0 = _now(device)
                    sparse = ef.compress(grad, key=w)
                    t1 = _now(device)
                    ef.compressor.decompress(sparse)
                    t2 = _now(device)
                    rows.append({"compressor": name, "density": density, "error_feedback": 1, "worker": w,
                                 "numel": grad.numel(), "compress_s": t1 - t0, "decompress_s": t2 - t1,
                                 "wire_bytes": sparse.wire_bytes()})
        return cls.from_replay_rows(rows, source=f"compressors run on {trace} ({device})")

    @classmethod
    def synthetic(
        cls,
        compressors: Sequence[str],
        densities: Sequence[float],
        *,
        numel: int = 1 << 20,
        workers: int = 2,
        device: str = "cpu",
        seed: int = 0,
    ) -> CompressionProfile:
        """Measure costs on a synthetic Laplace trace of ``numel`` elements (for layouts,
        which have no gradients); times are this machine's ``device``."""
        import traces

        with tempfile.TemporaryDirectory(prefix="sidco-profile-") as tmp:
            trace = traces.synthetic(f"{tmp}/laplace", "laplace", numel, workers=workers, iterations=2, seed=seed)
            profile = cls.from_trace(trace, compressors, densities, device=device)
        return cls(profile.costs, f"synthetic Laplace, {numel} elements, {device}")


def _now(device: str) -> float:
    """Wall clock (s) after the device has finished its queued work."""
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)
    return time.perf_counter()
