"""Per-bucket state of the DDP hook that survives DDP's bucket rebuild.

DDP groups parameters into buckets in a first guess, then rebuilds the buckets after
the first iteration in the order gradients became ready; bucket *indices* then point
at different parameters. The hook's error-feedback residual and its compressor
(which may carry adaptive state, e.g. SIDCo's stage count) are therefore keyed by a
bucket's **layout**: the tuple of ``(parameter key, numel)`` of its parameters in
buffer order, where the parameter key is the parameter's ``data_ptr()`` (stable for
the life of the model; DDP never moves parameters).

When a layout is seen for the first time, its residual is assembled from the
residual slices its parameters had in earlier layouts (zeros for parameters never
seen), and the earlier layouts that shared a parameter are dropped. So no residual
mass is lost when DDP rebuilds its buckets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

Layout = tuple[tuple[int, int], ...]
"""A bucket's parameters in buffer order: ``((parameter key, numel), ...)``."""


def layout_of(parameters: list[torch.Tensor]) -> Layout:
    """Return the layout key of a bucket holding ``parameters`` (``GradBucket.parameters()``)."""
    return tuple((p.data_ptr(), p.numel()) for p in parameters)


@dataclass
class BucketSlot:
    """What the hook keeps for one bucket layout.

    Attributes:
        layout: the layout this slot belongs to.
        compressor: this bucket's own compressor instance (adaptive state is per bucket).
        residual: the error-feedback residual (dense, the bucket's dtype and device),
            or ``None`` when error feedback is off.
    """

    layout: Layout
    compressor: Any
    residual: torch.Tensor | None = None


@dataclass
class BucketMemory:
    """Bucket slots keyed by layout, with residual migration across bucket rebuilds.

    Args:
        make_compressor: builds a fresh compressor for a new layout.
        error_feedback: keep a residual per slot.
    """

    make_compressor: Callable[[], Any]
    error_feedback: bool = True
    slots: dict[Layout, BucketSlot] = field(default_factory=dict)
    orphans: dict[int, torch.Tensor] = field(default_factory=dict)
    """Residual slices (views) of parameters whose old layout was dropped, by parameter key."""
    migrations: int = 0
    """How many older layouts were dropped because a new layout took their parameters."""

    def slot(self, layout: Layout, like: torch.Tensor) -> BucketSlot:
        """Return the slot for ``layout``, creating it (and migrating residuals) if new.

        ``like`` is the bucket's flat buffer: a new residual takes its dtype and device.
        Raises ``ValueError`` if the layout's sizes do not add up to ``like.numel()``.
        """
        found = self.slots.get(layout)
        if found is not None:
            return found
        total = sum(numel for _, numel in layout)
        if total != like.numel():
            raise ValueError(f"bucket parameters hold {total} elements but the bucket buffer has {like.numel()}")
        residual = torch.zeros_like(like) if self.error_feedback else None
        self._migrate(layout, residual)
        slot = BucketSlot(layout=layout, compressor=self.make_compressor(), residual=residual)
        self.slots[layout] = slot
        return slot

    def _migrate(self, layout: Layout, residual: torch.Tensor | None) -> None:
        """Fill ``residual`` (if any) from the slices its parameters had in older layouts.

        Older layouts that share a parameter with ``layout`` are dropped; the residual
        slices of their other parameters wait in :attr:`orphans` for the layout that
        claims them next.
        """
        wanted = {key for key, _ in layout}
        for old_layout in [old for old in self.slots if not wanted.isdisjoint(key for key, _ in old)]:
            old = self.slots.pop(old_layout)
            offset = 0
            for key, numel in old_layout:
                if old.residual is not None:
                    self.orphans[key] = old.residual[offset : offset + numel]
                offset += numel
            self.migrations += 1
        if residual is None:
            return
        offset = 0
        for key, numel in layout:
            orphan = self.orphans.pop(key, None)
            if orphan is not None:
                residual[offset : offset + numel].copy_(orphan)
            offset += numel
