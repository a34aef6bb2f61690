"""Per-bucket state of the DDP hook that survives DDP's bucket rebuild.

DDP groups parameters into buckets in a first guess, then rebuilds the buckets after
the first iteration in the order gradients became ready; bucket *indices* then point
at different parameters. The hook's compressor (which may carry adaptive state, e.g.
SIDCo's stage count) and its memory (the error-feedback residual, or DGC's momentum
and velocity) are therefore keyed by a bucket's **layout**: the tuple of
``(parameter key, numel)`` of its parameters in buffer order, where the parameter key
is the parameter's ``data_ptr()`` (stable for the life of the model; DDP never moves
parameters).

When a layout is seen for the first time, its memory state is assembled from the
slices its parameters had in earlier layouts (zeros for parameters never seen), and
the earlier layouts that shared a parameter are dropped. So no residual mass is lost
when DDP rebuilds its buckets.

The memories are the package's own (:class:`compressors.ErrorFeedback`,
:class:`compressors.DGCMemory`), one per bucket, used with the single key ``None``;
their per-key ``state`` dicts are what is migrated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from compressors.base import Compressor
from compressors.memory import Memory
from compressors.messages.sparse import Sparse

Layout = tuple[tuple[int, int], ...]
"""A bucket's parameters in buffer order: ``((parameter key, numel), ...)``."""

KEY = None
"""The key each per-bucket memory keeps its state under (one memory per bucket)."""


def layout_of(parameters: list[torch.Tensor]) -> Layout:
    """Return the layout key of a bucket holding ``parameters`` (``GradBucket.parameters()``)."""
    return tuple((p.data_ptr(), p.numel()) for p in parameters)


@dataclass
class BucketSlot:
    """What the hook keeps for one bucket layout.

    Attributes:
        layout: the layout this slot belongs to.
        compressor: this bucket's own compressor instance.
        memory: the memory around it (``None``: compress the bucket as it is).
    """

    layout: Layout
    compressor: Compressor
    memory: Memory | None = None

    def compress(self, bucket: torch.Tensor) -> Sparse:
        """Compress ``bucket`` through the memory (if any) and the compressor."""
        if self.memory is None:
            return self.compressor.compress(bucket)
        return self.memory.compress(bucket, KEY)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The memory's state tensors (each shaped like the bucket), e.g. ``{"residual": ...}``."""
        if self.memory is None:
            return {}
        return dict(self.memory.state.get(KEY, {}))


@dataclass
class BucketMemory:
    """Bucket slots keyed by layout, with memory-state migration across bucket rebuilds.

    Args:
        make_compressor: builds a fresh compressor for a new bucket, given ``bucket.index()``
            (the same on every rank).
        make_memory: wraps a compressor in a memory, or ``None`` for no memory.
    """

    make_compressor: Callable[[int], Compressor]
    make_memory: Callable[[Compressor], Memory] | None = None
    slots: dict[Layout, BucketSlot] = field(default_factory=dict)
    orphans: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    """State slices (views) of parameters whose old layout was dropped, by parameter key."""
    migrations: int = 0
    """How many older layouts were dropped because a new layout took their parameters."""

    def slot(self, layout: Layout, like: torch.Tensor, index: int) -> BucketSlot:
        """Return the slot for ``layout``, creating it (and migrating memory state) if new.

        ``like`` is the bucket's flat buffer (migrated state takes its dtype and device);
        ``index`` is the bucket's index, passed to ``make_compressor``.
        Raises ``ValueError`` if the layout's sizes do not add up to ``like.numel()``.
        """
        found = self.slots.get(layout)
        if found is not None:
            return found
        total = sum(numel for _, numel in layout)
        if total != like.numel():
            raise ValueError(f"bucket parameters hold {total} elements but the bucket buffer has {like.numel()}")
        compressor = self.make_compressor(index)
        slot = BucketSlot(layout, compressor, self.make_memory(compressor) if self.make_memory else None)
        self._migrate(slot, like)
        self.slots[layout] = slot
        return slot

    def _migrate(self, slot: BucketSlot, like: torch.Tensor) -> None:
        """Fill the new ``slot``'s memory from the slices its parameters had in older layouts.

        Older layouts that share a parameter with the new one are dropped; the state slices
        of their other parameters wait in :attr:`orphans` for the layout that claims them next.
        """
        wanted = {key for key, _ in slot.layout}
        for old_layout in [old for old in self.slots if not wanted.isdisjoint(key for key, _ in old)]:
            old_tensors = self.slots.pop(old_layout).tensors()
            offset = 0
            for key, numel in old_layout:
                if old_tensors:
                    self.orphans[key] = {name: t[offset : offset + numel] for name, t in old_tensors.items()}
                offset += numel
            self.migrations += 1
        claimed = [(key, numel, self.orphans.pop(key, None)) for key, numel in slot.layout]
        names = sorted({name for _, _, parts in claimed if parts for name in parts})
        if slot.memory is None or not names:
            return
        state = {name: torch.zeros_like(like) for name in names}
        offset = 0
        for _, numel, parts in claimed:
            for name, part in (parts or {}).items():
                state[name][offset : offset + numel].copy_(part)
            offset += numel
        slot.memory.state[KEY] = state
