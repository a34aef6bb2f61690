"""Counting what a compressor's call did, op by op: the measuring side of the declared work.

:func:`record_ops` runs a call under a ``TorchDispatchMode`` and lists the torch operations it
dispatched (and each native kernel); :func:`loop_counts` reads from that list the data-dependent
loop counts :func:`compressors.work.work` takes (``rounds``, ``trim``, ``hits``, SIDCo's native
``steps``/``pool``/``collects``). Profiles record them beside their timings and the drift test
(tests/test_compressors_work.py) checks declarations against them. Imports torch when called.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

FUSED_MARKER = "fused."
"""Prefix of :func:`record_ops`'s name for each Triton kernel launch of :mod:`compressors.kernels.fused`
(``fused.statistics``, ``fused.compact``): a launch, though no torch dispatch."""

HITS_MARKER = "native.hits:"
"""Prefix of :func:`record_ops`'s marker after each native selection: the elements it kept."""


def record_ops(call: Callable[[], Any]) -> tuple[Any, list[str]]:
    """Run ``call`` and return its result and the names of the torch operations it dispatched,
    in order (``torch.utils._python_dispatch.TorchDispatchMode``; untimed, for counting), with
    each native selection as ``native.select_above`` followed by the marker ``native.hits:<kept
    elements>`` (not an operation), each ``native.scan`` kernel as
    ``native.scan:full`` (over as many elements as the call's first kernel; followed by
    ``native.scan:collect`` when it also selected) or ``native.scan:pool:<elements>``, and each
    host count over a pool (``native.count_above``, no kernel) as ``native.count:<elements>``, and
each Triton kernel launched by :mod:`compressors.kernels.fused` as ``fused.<kernel>``."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from compressors.kernels import native

    names: list[str] = []
    select, scan, count = native.select_above, native.scan, native.count_above
    first: list[int] = []

    def counted_count(x, threshold):
        names.append(f"native.count:{x.size}")
        return count(x, threshold)

    def counted_select(*args, **kwargs):
        names.append("native.select_above")
        found = select(*args, **kwargs)
        names.append(f"{HITS_MARKER}{(found[0] if kwargs.get('with_stats') else found).indices.numel()}")
        return found

    def counted_scan(x, **kwargs):
        first.append(x.numel())
        names.append("native.scan:full" if x.numel() >= first[0] else f"native.scan:pool:{x.numel()}")
        if x.numel() >= first[0] and kwargs.get("select") is not None:
            names.append("native.scan:collect")
        return scan(x, **kwargs)

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    fused = _fused_module()
    launch = fused._launch if fused is not None else None

    def counted_launch(kernel, grid, *args, **meta):
        if grid:
            names.append(f"{FUSED_MARKER}{kernel}")
        return launch(kernel, grid, *args, **meta)

    native.select_above, native.scan, native.count_above = counted_select, counted_scan, counted_count
    if fused is not None:
        fused._launch = counted_launch
    try:
        with torch.no_grad(), Recorder():
            result = call()
    finally:
        native.select_above, native.scan, native.count_above = select, scan, count
        if fused is not None:
            fused._launch = launch
    return result, names


def _fused_module() -> Any:
    """:mod:`compressors.kernels.fused` when Triton is installed (its launches are counted), else None."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return None
    from compressors.kernels import fused

    return fused


def stage_counts(compressor: Any) -> dict[str, int]:
    """For SIDCo, the stage count its last call planned and the stages it added within itself
    (``planned``, ``deepened`` of its :class:`compressors.sidco.Report`: what its work follows,
    :func:`compressors.work.work`, where the message's ``stages`` counts those that lowered the
    threshold); nothing for other compressors."""
    if not compressor.name.startswith("sidco"):
        return {}
    return {"planned": compressor.last.planned, "deepened": compressor.last.deepened}


def selections(ops: Sequence[str]) -> int:
    """Selections one call ran: its ``nonzero`` compactions, native selections and fused compactions."""
    return ops.count("nonzero") + ops.count("native.select_above") + ops.count(f"{FUSED_MARKER}compact")


def kept_hits(ops: Sequence[str]) -> dict[str, list[int]]:
    """``{"hits": [...]}``: the elements each native selection of the call kept, in order (nothing
    where it ran none)."""
    hits = [int(op[len(HITS_MARKER):]) for op in ops if op.startswith(HITS_MARKER)]
    return {"hits": hits} if hits else {}


def loop_counts(name: str, ops: Sequence[str], stages: int | None = None) -> dict[str, Any]:
    """The data-dependent loop counts of one call of compressor ``name`` from the operations it
    dispatched (:func:`record_ops`), as :func:`compressors.work.work` takes them: what its card's
    ``loops`` reads (:class:`compressors.work.cards.Card`; nothing for a compressor whose work
    depends on the size and density alone). ``stages``: SIDCo's planned stage count, when known."""
    from compressors.work import CARDS

    reader = CARDS[name].loops if name in CARDS else None
    return reader(ops, stages) if reader is not None else {}
