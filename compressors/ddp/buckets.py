"""How ``DistributedDataParallel`` groups gradients into buckets: the one rule the replay, the
simulator and the emulation's projection all use.

DDP (torch 2.13) reduces its first iteration as one bucket, then rebuilds its buckets once, in
the order the gradients became ready; from the second iteration on, with gradients ready in
reverse parameter order (the usual case: backward runs the layers last to first), the buckets
are what :func:`assign` returns. Parameters are taken in reverse order and a bucket is closed as
soon as it holds at least its cap: ``first_bytes`` for the first bucket, ``cap_bytes`` for every
later one (a parameter larger than the cap closes a bucket of its own). Sizes are bytes;
DDP's ``bucket_cap_mb`` counts MiB (2²⁰ bytes).

``DistributedDataParallel(model)`` caps the first bucket at ``dist._DEFAULT_FIRST_BUCKET_BYTES``
(1 MiB) and the others at 25 MiB; ``DistributedDataParallel(model, bucket_cap_mb=x)`` caps every
bucket, the first included, at ``x`` MiB (:func:`bucket_caps`). ``tests/test_ddp_buckets.py``
checks :func:`assign` against torch's own assignment and against the buckets a real DDP hands
to its communication hook.
"""

from __future__ import annotations

from collections.abc import Sequence

MIB = 1024 * 1024
"""Bytes in one MiB, the unit of DDP's ``bucket_cap_mb``."""

DEFAULT_BUCKET_CAP_BYTES = 25 * MIB
"""DDP's default bucket cap (bytes): ``bucket_cap_mb=25``."""

DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB
"""DDP's default cap of the first bucket (bytes), ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``."""


def bucket_caps(bucket_cap_mb: float | None = None) -> tuple[int, int]:
    """The ``(first_bytes, cap_bytes)`` caps (bytes) of ``DistributedDataParallel(bucket_cap_mb=...)``.

    ``None`` (DDP's default) gives 1 MiB and 25 MiB; a value ``x`` (MiB, > 0) gives
    ``int(x·2²⁰)`` for both, as DDP does when the cap is set explicitly.
    """
    if bucket_cap_mb is None:
        return DEFAULT_FIRST_BUCKET_BYTES, DEFAULT_BUCKET_CAP_BYTES
    if not bucket_cap_mb > 0:
        raise ValueError(f"bucket cap must be > 0 MiB, got {bucket_cap_mb!r}")
    cap = int(bucket_cap_mb * MIB)
    if cap < 1:
        raise ValueError(f"bucket cap of {bucket_cap_mb!r} MiB is under one byte")
    return cap, cap


def assign(
    nbytes: Sequence[int],
    cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES,
    first_bytes: int = DEFAULT_FIRST_BUCKET_BYTES,
) -> list[list[int]]:
    """Group parameters into DDP buckets; returns parameter indices per bucket, in reduction order.

    ``nbytes``: each parameter's gradient size in bytes, in parameter (definition) order.
    Bucket 0 holds the last parameters (their gradients are ready first); inside a bucket the
    indices descend. Caps are bytes (> 0); see the module docstring for the rule.
    """
    if cap_bytes <= 0 or first_bytes <= 0:
        raise ValueError(f"bucket caps must be > 0 bytes, got first {first_bytes!r}, cap {cap_bytes!r}")
    groups: list[list[int]] = []
    current: list[int] = []
    size = 0
    for index in range(len(nbytes) - 1, -1, -1):
        current.append(index)
        size += int(nbytes[index])
        if size >= (cap_bytes if groups else first_bytes):
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    return groups
