"""A DistributedDataParallel communication hook that sends compressed gradients.

Usage::

    import compressors.ddp
    state, hook = compressors.ddp.comm_hook("sidco-e", 0.01)
    model = torch.nn.parallel.DistributedDataParallel(model)
    model.register_comm_hook(state, hook)     # once, before the first backward

The pair follows the pattern of PyTorch's ``powerSGD_hook``: a state object
(:class:`CompressionHookState`: the compressor per bucket, the error-feedback memory,
counters and a per-bucket log) and a pure function (:func:`compression_hook`) that DDP
calls once per gradient bucket. Works on gloo (CPU) and NCCL (CUDA).

Per-bucket log (for measuring communication time per bucket): ``state.log`` is a
``collections.deque`` (the newest ``log_size`` entries) of dicts with the keys

- ``iteration``: training step (0-based; counted by the hook, +1 after each last bucket)
- ``bucket``: ``GradBucket.index()``
- ``path``: ``"allreduce"`` (dense sum) or ``"allgather"`` (two-phase padded sparse all-gather)
- ``numel``: elements in the bucket
- ``selected``: elements this rank sent (``numel`` on the all-reduce path)
- ``padded``: slots every rank sent in phase 2 (the largest count; ``numel`` for all-reduce)
- ``bytes_sent``: bytes this rank handed to the collectives (bytes), padding and the
  8-byte count included
- ``payload_bytes``: bytes of this rank's own message without padding (bytes): values in
  their dtype plus int32 indices (the compressor's ``wire_bytes()`` accounting)
- ``compress_s``: seconds spent adding the residual, compressing and updating the residual
- ``comm_s``: seconds from the hook's start to the completion of its future (compression,
  both phases and the dense scatter-add included). On CUDA this is host time: NCCL
  futures complete when the work is enqueued on the stream, so synchronise first if you
  need device time.

``state.bytes_sent`` and ``state.payload_bytes`` total the same two byte counts over all
buckets; ``state.iteration`` is the number of completed steps.
"""

import collections
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist

import compressors
from compressors.ddp_exchange import resolve_gather, sparse_allgather_sum
from compressors.ddp_memory import BucketMemory, layout_of

HookFn = Callable[["CompressionHookState", dist.GradBucket], torch.futures.Future[torch.Tensor]]


@dataclass
class CompressionHookState:
    """Everything :func:`compression_hook` keeps between calls.

    Attributes:
        name: compressor name (one of ``compressors.names()``).
        density: target fraction of elements sent per bucket, in (0, 1].
        options: extra keyword options passed to ``compressors.create``.
        process_group: the group to communicate in (``None``: the default group).
        gather: ``"auto"``, ``"single"`` (``all_gather_single``) or ``"into_tensor"``
            (``all_gather_into_tensor``, deprecated in torch 2.13).
        memory: per-bucket compressors and error-feedback residuals, keyed by the
            bucket's parameters so that they survive DDP's bucket rebuild.
        iteration: completed training steps seen by the hook.
        bytes_sent: total bytes handed to the collectives by this rank (bytes).
        payload_bytes: total bytes of this rank's unpadded messages (bytes).
        log: the newest per-bucket records (see the module docstring).
    """

    name: str
    density: float
    options: dict[str, Any]
    process_group: dist.ProcessGroup | None
    gather: str
    memory: BucketMemory
    iteration: int = 0
    bytes_sent: int = 0
    payload_bytes: int = 0
    log: collections.deque = field(default_factory=lambda: collections.deque(maxlen=10_000))

    @property
    def world_size(self) -> int:
        """Number of ranks in the process group."""
        return dist.get_world_size(self.process_group)

    def record(self, entry: dict[str, Any]) -> None:
        """Append one bucket's record to :attr:`log` and add its bytes to the totals."""
        self.bytes_sent += entry["bytes_sent"]
        self.payload_bytes += entry["payload_bytes"]
        self.log.append(entry)


def comm_hook(
    name: str,
    density: float,
    *,
    process_group: dist.ProcessGroup | None = None,
    error_feedback: bool = True,
    gather: str = "auto",
    log_size: int = 10_000,
    **options: Any,
) -> tuple[CompressionHookState, HookFn]:
    """Return ``(state, hook)`` for ``DistributedDataParallel.register_comm_hook(state, hook)``.

    Args:
        name: compressor name, e.g. ``"sidco-e"``, ``"topk"``, ``"dgc"``, ``"none"``.
        density: target fraction of each bucket's elements to send, in (0, 1].
        process_group: group to communicate in (``None``: the default group).
        error_feedback: keep a residual per bucket (``g += r; send C(g); r = g - sent``).
        gather: all-gather entry point, ``auto`` | ``single`` | ``into_tensor``.
        log_size: how many per-bucket records ``state.log`` keeps (newest).
        **options: passed to ``compressors.create`` (e.g. ``stages=2`` for SIDCo).

    Bad input (unknown compressor, density outside (0, 1], unknown option or gather
    method) raises ``ValueError`` here, before training starts.
    """
    resolve_gather(gather)
    if log_size < 1:
        raise ValueError(f"log_size must be at least 1, got {log_size}")

    def make_compressor() -> Any:
        return compressors.create(name, density=density, **options)

    make_compressor()
    state = CompressionHookState(
        name=name,
        density=density,
        options=dict(options),
        process_group=process_group,
        gather=gather,
        memory=BucketMemory(make_compressor=make_compressor, error_feedback=error_feedback and name != "none"),
        log=collections.deque(maxlen=log_size),
    )
    return state, compression_hook


def compression_hook(state: CompressionHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average one gradient bucket over all ranks, sending a compressed selection.

    Steps (every rank takes the same ones, decided only by values all ranks share):

    1. Count the step: after the bucket whose ``is_last()`` is true, ``state.iteration`` grows.
    2. ``none``: all-reduce the dense bucket, divide by the world size, done.
    3. Find this bucket's slot (compressor + residual) by its parameters' layout. After
       DDP rebuilds its buckets (after the first step), a new layout's residual is
       assembled from its parameters' old residual slices (:mod:`compressors.ddp_memory`).
    4. Error feedback: add the residual to the bucket (in place: the bucket's contents
       are replaced by the averaged result at the end anyway).
    5. Compress the bucket with the slot's compressor. A compressor error on any rank
       must not leave the others waiting: the failing rank announces it in phase 1
       and all ranks raise ``ValueError`` together. An empty selection (which the
       compressors never return for a non-empty bucket) is replaced by the single
       largest-magnitude element, so no rank ever sends nothing.
    6. Residual ← bucket − scatter(selected values): what was not sent this step.
    7. Exchange by the two-phase padded all-gather (:mod:`compressors.ddp_exchange`):
       all-gather the counts, pad to the largest, all-gather indices (bit-cast) and
       values, then scatter-add every rank's selection, rank by rank, into the
       bucket's buffer.
    8. Divide by the world size (DDP expects the average; the hook must not pre-divide
       the input) and log the bucket's bytes and seconds.

    Returns a future whose tensor has ``bucket.buffer()``'s shape (it is that buffer).
    The annotations are real objects (no ``from __future__ import annotations`` in this
    module): ``register_comm_hook`` compares them with ``dist.GradBucket`` and
    ``torch.futures.Future[torch.Tensor]``.
    """
    start = time.perf_counter()
    buffer = bucket.buffer()
    group = state.process_group
    world = state.world_size
    iteration, index = state.iteration, bucket.index()
    if bucket.is_last():
        state.iteration += 1

    if state.name == "none":
        dense_bytes = buffer.numel() * buffer.element_size()

        def finish_dense(_: torch.futures.Future) -> torch.Tensor:
            buffer.div_(world)
            state.record({
                "iteration": iteration, "bucket": index, "path": "allreduce",
                "numel": buffer.numel(), "selected": buffer.numel(), "padded": buffer.numel(),
                "bytes_sent": dense_bytes, "payload_bytes": dense_bytes,
                "compress_s": 0.0, "comm_s": time.perf_counter() - start,
            })
            return buffer

        return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(finish_dense)

    slot = state.memory.slot(layout_of(bucket.parameters()), buffer)
    error: str | None = None
    if slot.residual is not None:
        buffer.add_(slot.residual)
    try:
        selection = slot.compressor.compress(buffer)
        values, indices = selection.values.to(buffer.dtype), selection.indices.long()
    except ValueError as exc:
        error = f"bucket {index}: {exc}"
        values, indices = buffer[:0], torch.zeros(0, dtype=torch.long, device=buffer.device)
    if error is None and values.numel() == 0:
        indices = buffer.abs().argmax().view(1)
        values = buffer[indices]
    if slot.residual is not None and error is None:
        slot.residual.copy_(buffer).index_add_(0, indices, values, alpha=-1)
    compress_s = time.perf_counter() - start

    exchange = sparse_allgather_sum(values, indices, buffer.numel(), group, state.gather, out=buffer, error=error)

    def finish_sparse(fut: torch.futures.Future) -> torch.Tensor:
        dense = fut.value()
        dense.div_(world)
        state.record({
            "iteration": iteration, "bucket": index, "path": "allgather",
            "numel": buffer.numel(), "selected": int(values.numel()), "padded": exchange.padded_count,
            "bytes_sent": exchange.bytes_sent, "payload_bytes": exchange.payload_bytes,
            "compress_s": compress_s, "comm_s": time.perf_counter() - start,
        })
        return dense

    return exchange.future.then(finish_sparse)
