"""Counting what a compressor call actually does: every torch operation, classified as the
declarations of :mod:`compressors.work` classify them (streaming pass, top-k, sort, gather,
compaction, 0-d arithmetic, synchronisation)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

VIEWS = {"squeeze", "slice", "view", "unsqueeze", "reshape", "alias", "as_strided", "empty", "detach", "t",
         "select", "_reshape_alias", "expand", "transpose"}
GATHERS = {"index_select", "index_add_", "index_copy_", "index", "index_fill_"}
WRITE_ONLY = {"zero_", "fill_", "zeros_like", "randperm", "randint", "empty_like", "zeros", "arange"}


class OpCounter(TorchDispatchMode):
    """Counts of one region: passes over ``numel`` elements, bytes of streaming ops, launches,
    syncs, top-k/sort/gather/compaction calls, and ``fresh``: the bytes of every new buffer of
    at least ``numel`` bytes an op returned (storage shared with none of its inputs)."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel = numel
        self.counts = {"passes": 0, "bytes": 0.0, "launches": 0, "syncs": 0, "topk": 0, "sort": 0,
                       "gather": 0, "compact": 0}
        self.fresh: list[int] = []
        self.ops: list[str] = []

    def __enter__(self):
        """Also count ``Tensor.tolist`` and ``Tensor.numpy`` (a copy to the host read there) as
        synchronisations (on the CPU they dispatch no op)."""
        self._originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy")}

        def counted(name, original):
            def read(tensor, *args, **kwargs):
                self.counts["syncs"] += 1
                self.ops.append(name)
                return original(tensor, *args, **kwargs)
            return read

        for name, original in self._originals.items():
            setattr(torch.Tensor, name, counted(name, original))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._originals.items():
            setattr(torch.Tensor, name, original)
        return super().__exit__(*exc)

    def _count_fresh(self, args, kwargs, out) -> None:
        held = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in held \
                    and t.untyped_storage().nbytes() >= self.numel:
                self.fresh.append(t.untyped_storage().nbytes())
                held.add(t.untyped_storage().data_ptr())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        self.ops.append(name)
        c = self.counts
        self._count_fresh(args, kwargs, out)
        if name in VIEWS:
            return out
        if name == "_local_scalar_dense":
            c["syncs"] += 1
            return out
        c["launches"] += 1
        inputs = [t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)]
        out_arg = kwargs.get("out")
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if name == "nonzero":
            c["compact"] += 1
            c["syncs"] += 1
        elif name == "_unique2":
            c["sort"] += 1
            c["syncs"] += 1
        elif name == "topk":
            c["topk"] += 1
        elif name == "sort":
            c["sort"] += 1
        elif name in GATHERS:
            c["gather"] += 1
        else:
            sizes = [t.numel() for t in inputs + outputs]
            if max(sizes, default=0) >= self.numel:
                c["passes"] += 1
            if max(sizes, default=0) > 1:
                read = 0 if name in WRITE_ONLY else sum(t.nbytes for t in inputs if t is not out_arg)
                if name == "copy_":
                    read = inputs[1].nbytes
                c["bytes"] += read + sum(t.nbytes for t in outputs)
        return out
