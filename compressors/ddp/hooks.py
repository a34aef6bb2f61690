"""A DistributedDataParallel communication hook that sends compressed gradients.

Usage::

    import compressors.ddp
    state, hook = compressors.ddp.comm_hook("sidco-e", 0.01)
    model = torch.nn.parallel.DistributedDataParallel(model)
    model.register_comm_hook(state, hook)     # once, before the first backward

The pair follows the pattern of PyTorch's ``powerSGD_hook``: a state object
(:class:`CompressionHookState`: a compressor and a memory per bucket, the exchange, counters and
a per-bucket log) and a pure function (:func:`compression_hook`, its steps as comments in its
body) that DDP calls once per gradient bucket. Works on gloo (CPU) and NCCL (CUDA). Each bucket
is compressed as one 1-D vector at the target density.

The exchange is chosen once, when the state is made (:func:`comm_hook`), from the compressor and
its options alone by :func:`compressors.messages.wire.collective` (so every rank takes the same),
with the byte counts of :mod:`compressors.messages.wire`; the hook only starts it
(:mod:`compressors.ddp.exchange`):

- ``none``: plain all-reduce of the dense bucket (:class:`~compressors.ddp.exchange.DenseAllReduce`);
- ``randomk`` with ``seed=``: every rank draws the same indices (each bucket's compressor
  is seeded with ``seed + 1_000_003 * bucket.index()``, identical on all ranks: its card's
  :meth:`~compressors.work.cards.Card.bucket_options`), so only
  the values are all-reduced (plus one float flag, see below;
  :class:`~compressors.ddp.exchange.ValuesAllReduce`);
- a quantizer (``int8``, ``fp8``, ``int4``): an all-gather of every rank's codes and scales, each rank dequantizing
  and adding them all (:class:`~compressors.ddp.exchange.QuantizedAllGather`);
- every other compressor: the two-phase padded all-gather of values and indices
  (:class:`~compressors.ddp.exchange.PaddedAllGather`);
- the low-rank and dense casts (``powersgd``, ``fp16``, ``bf16``): PyTorch's own hooks, below.

Per-bucket log (for measuring communication time per bucket): ``state.log`` is a
``collections.deque`` (the newest ``log_size`` entries) of dicts with the keys

- ``iteration``: training step (0-based; counted by the hook, +1 after each last bucket)
- ``bucket``: ``GradBucket.index()``
- ``path``: ``"allreduce"``, ``"allreduce-values"`` or ``"allgather"``
- ``numel``: elements in the bucket
- ``selected``: elements this rank sent (``numel`` on the dense path)
- ``padded``: value slots every rank sent (the largest count on the all-gather path)
- ``bytes_sent``: bytes this rank handed to the collectives (bytes): padding, the
  8-byte count (all-gather, ``wire.allgather_bytes``) or the 1-element flag (values
  all-reduce, ``wire.values_allreduce_bytes``) included
- ``payload_bytes``: bytes of this rank's own message without padding or control
  (bytes): the compressor's ``Sparse.wire_bytes()``
- ``compress_s``: seconds spent in the memory and the compressor
- ``comm_s``: seconds from the hook's start to the completion of its future (compression,
  the collectives and the dense scatter-add included). On CUDA this is host time: NCCL
  futures complete when the work is enqueued on the stream, so synchronise first if you
  need device time.

``state.bytes_sent`` and ``state.payload_bytes`` total the same two byte counts over all
buckets; ``state.iteration`` is the number of completed steps.

A compressor that rejects its input on one rank (``ValueError``, e.g. NaN in the
gradient) makes every rank raise ``ValueError`` in the same step: the failure travels in
the first collective (a count of -1, or the flag), so no rank is left waiting for a peer.

The dense and low-rank baselines are PyTorch's own hooks, delegated to unchanged
(:func:`comm_hook` with ``"fp16"``, ``"bf16"`` or ``"powersgd"`` returns a
:class:`TorchHookState` and :func:`torch_hook`): ``default_hooks.fp16_compress_hook`` /
``bf16_compress_hook`` (divide by the world size, cast, all-reduce, cast back) and
``powerSGD_hook.powerSGD_hook`` with its ``PowerSGDState``. The wrapper only counts steps and
writes the same per-bucket log (``path`` ``"allreduce-fp16"``, ``"allreduce-bf16"``,
``"powersgd"``, or ``"allreduce"`` for PowerSGD's plain all-reduce steps before
``start_iter``), so the gradients are bit for bit those of the PyTorch hook registered directly.
"""

import collections
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd

import compressors
from compressors.base import Compressor
from compressors.ddp.exchange import (DenseAllReduce, Exchange, PaddedAllGather, QuantizedAllGather, Selection,
                                      ValuesAllReduce, resolve_gather)
from compressors.ddp.memory import BucketMemory, layout_of
from compressors.memory import DGCMemory, ErrorFeedback, Memory
from compressors.powersgd import plan as powersgd_plan
from compressors.messages.kinds import Quantized
from compressors.messages.wire import ALLREDUCE, collective
from units import check_count

HookFn = Callable[["CompressionHookState", dist.GradBucket], torch.futures.Future[torch.Tensor]]

MEMORIES: tuple[str, ...] = ("residual", "dgc-momentum", "none")
"""``residual``: error feedback; ``dgc-momentum``: DGC's momentum correction and masking
(then run the optimizer without momentum); ``none``: no memory."""

TORCH_HOOKS: tuple[str, ...] = ("fp16", "bf16", "powersgd")
"""Compressors whose DDP hook is PyTorch's own (see the module docstring)."""

class _HookLog:
    """The per-bucket log and byte totals both hook states keep (same keys and units)."""

    process_group: dist.ProcessGroup | None
    bytes_sent: int
    payload_bytes: int
    log: collections.deque

    @property
    def world_size(self) -> int:
        """Number of ranks in the process group."""
        return dist.get_world_size(self.process_group)

    def record(self, entry: dict[str, Any]) -> None:
        """Append one bucket's record to :attr:`log` and add its bytes to the totals."""
        self.bytes_sent += entry["bytes_sent"]
        self.payload_bytes += entry["payload_bytes"]
        self.log.append(entry)


@dataclass
class CompressionHookState(_HookLog):
    """Everything :func:`compression_hook` keeps between calls.

    Attributes:
        name: compressor name (one of ``compressors.names()``).
        density: target fraction of elements sent per bucket, in (0, 1].
        options: extra keyword options passed to ``compressors.create``.
        process_group: the group to communicate in (``None``: the default group).
        exchange: how every bucket travels (module docstring), chosen once by :func:`comm_hook`.
        buckets: per-bucket compressors and memories, keyed by the bucket's parameters
            so that they survive DDP's bucket rebuild.
        iteration: completed training steps seen by the hook.
        bytes_sent: total bytes handed to the collectives by this rank (bytes).
        payload_bytes: total bytes of this rank's messages, ``wire_bytes()`` (bytes).
        log: the newest per-bucket records (see the module docstring).
    """

    name: str
    density: float
    options: dict[str, Any]
    process_group: dist.ProcessGroup | None
    exchange: Exchange
    buckets: BucketMemory
    iteration: int = 0
    bytes_sent: int = 0
    payload_bytes: int = 0
    log: collections.deque = field(default_factory=lambda: collections.deque(maxlen=10_000))

    @property
    def shared_indices(self) -> bool:
        """Whether every rank draws the same indices (shared-seed Random-k), so only values are
        all-reduced."""
        return isinstance(self.exchange, ValuesAllReduce)


def comm_hook(
    name: str,
    density: float,
    *,
    process_group: dist.ProcessGroup | None = None,
    memory: str = "residual",
    momentum: float = 0.9,
    gather: str = "auto",
    log_size: int = 10_000,
    **options: Any,
) -> tuple[CompressionHookState, HookFn]:
    """Return ``(state, hook)`` for ``DistributedDataParallel.register_comm_hook(state, hook)``.

    Args:
        name: compressor name, e.g. ``"sidco-e"``, ``"topk"``, ``"dgc"``, ``"none"``.
        density: target fraction of each bucket's elements to send, in (0, 1].
        process_group: group to communicate in (``None``: the default group).
        memory: ``"residual"`` (error feedback: ``g += r; send C(g); r = g - sent``),
            ``"dgc-momentum"`` (DGC's momentum correction; use an optimizer without
            momentum) or ``"none"``. Ignored for ``name="none"``.
        momentum: momentum factor of ``"dgc-momentum"``, in [0, 1).
        gather: all-gather entry point, ``auto`` | ``single`` | ``into_tensor``.
        log_size: how many per-bucket records ``state.log`` keeps (newest).
        **options: passed to ``compressors.create`` (e.g. ``stages=2`` for SIDCo,
            ``seed=0`` for Random-k with indices shared by all ranks).

    ``"fp16"``, ``"bf16"``, ``"powersgd"``: PyTorch's hooks (module docstring); ``density``
    is ignored. fp16/bf16 keep no memory (PyTorch's hooks have none). PowerSGD's options:
    ``rank`` (1), ``start_iter`` (steps of plain all-reduce first; default 2, PyTorch's minimum
    with error feedback or warm start), ``min_compression_rate`` (2), ``warm_start`` (True),
    ``seed`` (0), ``epsilon`` (0), ``batch_same_shape`` (False); ``memory="residual"`` is
    PyTorch's ``use_error_feedback=True``, ``memory="none"`` turns it off. On gloo, PyTorch's
    PowerSGD hook hangs with more than one bucket (it waits on collectives inside future
    callbacks, and the ranks' callbacks then issue them in different orders): on gloo a second
    bucket raises ``ValueError`` on every rank at the first PowerSGD step instead; use one bucket
    (``bucket_cap_mb`` above the model size) there. PyTorch's bf16 hook runs on gloo through this
    wrapper although DDP refuses to register it directly on a non-NCCL backend.

    Bad input (unknown compressor, density outside (0, 1], unknown option, memory or
    gather method) raises ``ValueError`` here, before training starts.
    """
    if name in TORCH_HOOKS:
        return _torch_hook_state(name, density, process_group, memory, log_size, options)
    method = resolve_gather(gather)
    if memory not in MEMORIES:
        raise ValueError(f"memory {memory!r} is not one of {', '.join(MEMORIES)}")
    check_count(log_size, "log_size")

    def make_compressor(index: int) -> Compressor:
        return compressors.create(name, density=density, **bucket_options(name, options, index))

    def make_memory(compressor: Compressor) -> Memory:
        if memory == "dgc-momentum":
            return DGCMemory(compressor, momentum=momentum)
        return ErrorFeedback(compressor)

    make_memory(make_compressor(0))
    state = CompressionHookState(
        name=name,
        density=density,
        options=dict(options),
        process_group=process_group,
        exchange=_exchange_for(name, density, options, method),
        buckets=BucketMemory(make_compressor, None if memory == "none" or name == "none" else make_memory),
        log=collections.deque(maxlen=log_size),
    )
    return state, compression_hook


def bucket_options(name: str, options: dict[str, Any], index: int) -> dict[str, Any]:
    """The options of bucket ``index``'s compressor: ``options``, with a shared seed (Random-k's
    ``seed``) offset by :data:`compressors.work.cards.SEED_STRIDE` per bucket (so that buckets draw
    different indices, identical on every rank): its card's
    :meth:`~compressors.work.cards.Card.bucket_options`."""
    return compressors.card(name).bucket_options(options, index)


def _exchange_for(name: str, density: float, options: dict[str, Any], gather: str) -> Exchange:
    """The exchange every bucket of compressor ``name`` takes (module docstring): all-reduce of the
    dense bucket, of the values at shared indices, or the padded all-gather through ``gather``."""
    if compressors.message_kind(name) == "quantized":
        quantizer = compressors.compressor_class(name)
        return QuantizedAllGather(gather, quantizer.block, quantizer.bits, quantizer.code_dtype)
    if collective(name, options) != ALLREDUCE:
        return PaddedAllGather(gather)
    return DenseAllReduce() if name == "none" else ValuesAllReduce(density)


def compression_hook(state: CompressionHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average one gradient bucket over all ranks, sending a compressed selection.

    Every rank takes the same steps, decided only by values all ranks share (the steps are
    comments in the body): count the step; compress the bucket through its memory; start the
    state's exchange; divide by the world size and log the bucket when it completes. If any
    rank's compressor failed, every rank raises ``ValueError`` in the exchange.

    Returns a future whose tensor has ``bucket.buffer()``'s shape (it is that buffer).
    The annotations are real objects (no ``from __future__ import annotations`` in this
    module): ``register_comm_hook`` compares them with ``dist.GradBucket`` and
    ``torch.futures.Future[torch.Tensor]``.
    """
    start = time.perf_counter()
    # The input is DDP's flat bucket, not divided by the world size; the result is written back
    # into it.
    buffer = bucket.buffer()
    world = state.world_size
    iteration, index, numel = state.iteration, bucket.index(), buffer.numel()

    # Step I: count the step: after the bucket whose ``is_last()`` is true, ``state.iteration``
    # grows.
    if bucket.is_last():
        state.iteration += 1

    # Step II: compress the bucket through its memory (an exchange of the whole bucket sends it
    # as it is). The slot (compressor + memory) is found by the bucket's parameters' layout:
    # after DDP rebuilds its buckets (after the first step), a new layout's memory state is
    # assembled from its parameters' old slices (compressors.ddp.memory). Error feedback adds
    # the residual, compresses, and keeps what was not sent. A ValueError from the compressor is
    # held, not raised, so that this rank still joins the exchange's first collective and reports
    # it there.
    if state.exchange.compresses:
        selection = _compress(state, bucket, buffer, index, start)
    else:
        selection = Selection(buffer, None, numel * buffer.element_size())

    # Step III: start the exchange chosen for this state (dense all-reduce, values all-reduce at
    # shared indices, or the padded all-gather of every rank's selection); its sum over ranks
    # lands in ``buffer``.
    started = state.exchange.start(buffer, selection, state.process_group)

    # Step IV: once it completes, divide by the world size (DDP expects the average) and log the
    # bucket's bytes and seconds.
    def average_and_log(_: torch.futures.Future) -> torch.Tensor:
        buffer.div_(world)
        state.record({
            "iteration": iteration, "bucket": index, "path": state.exchange.path, "numel": numel,
            "selected": started.selected, "padded": started.padded, "bytes_sent": started.bytes_sent,
            "payload_bytes": selection.payload_bytes, "compress_s": selection.compress_s,
            "comm_s": time.perf_counter() - start,
        })
        return buffer

    return started.future.then(average_and_log)


def _compress(state: CompressionHookState, bucket: dist.GradBucket, buffer: torch.Tensor, index: int,
              start: float) -> Selection:
    """Step II of :func:`compression_hook`: this rank's selection of ``buffer`` through its slot's
    memory, or the compressor's ``ValueError`` held in it; ``compress_s`` counts from ``start``
    (the hook's start, seconds of ``time.perf_counter``)."""
    slot = state.buckets.slot(layout_of(bucket.parameters()), buffer, index)
    try:
        message = slot.compress(buffer)
        if isinstance(message, Quantized):  # sent whole: codes and scales
            selection = Selection(buffer[:0], None, message.wire_bytes(), message=message,
                                  decompress=slot.compressor.decompress)
        else:
            selection = Selection(message.values.to(buffer.dtype), message.indices, message.wire_bytes())
    except ValueError as exc:
        selection = Selection(buffer[:0], torch.zeros(0, dtype=torch.long, device=buffer.device), 0,
                              error=f"bucket {index}: {exc}")
    return replace(selection, compress_s=time.perf_counter() - start)


@dataclass
class TorchHookState(_HookLog):
    """State of :func:`torch_hook`: PyTorch's hook and its state, what a bucket sends under it
    (``sends``: :func:`_cast_sends` or :func:`_powersgd_sends`, chosen once by :func:`comm_hook`),
    plus the step counter, byte totals and per-bucket log of :class:`CompressionHookState` (same
    keys and units)."""

    name: str
    inner_hook: Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]
    inner_state: Any
    process_group: dist.ProcessGroup | None
    sends: Callable[["TorchHookState", dist.GradBucket], tuple[str, int, int]]
    iteration: int = 0
    bytes_sent: int = 0
    payload_bytes: int = 0
    log: collections.deque = field(default_factory=lambda: collections.deque(maxlen=10_000))


POWERSGD_OPTIONS = {"rank": 1, "start_iter": 2, "min_compression_rate": 2.0, "warm_start": True, "seed": 0,
                    "epsilon": 0.0, "batch_same_shape": False}
"""The PowerSGD options :func:`comm_hook` accepts, with their defaults."""


def _torch_hook_state(name: str, density: float, process_group: dist.ProcessGroup | None, memory: str,
                      log_size: int, options: dict[str, Any]) -> tuple[TorchHookState, HookFn]:
    compressors.create(name, density=density)
    if memory not in ("residual", "none"):
        raise ValueError(f"memory {memory!r} is not available with PyTorch's {name} hook; use residual or none")
    check_count(log_size, "log_size")
    if name in ("fp16", "bf16"):
        if options:
            raise ValueError(f"bad options for compressor {name!r}: {', '.join(options)}")
        inner = default_hooks.fp16_compress_hook if name == "fp16" else default_hooks.bf16_compress_hook
        return TorchHookState(name, inner, process_group, process_group, _cast_sends,
                              log=collections.deque(maxlen=log_size)), torch_hook
    unknown = sorted(set(options) - set(POWERSGD_OPTIONS))
    if unknown:
        raise ValueError(f"bad options for compressor 'powersgd': {', '.join(unknown)}")
    chosen = {**POWERSGD_OPTIONS, **options}
    compressors.create("powersgd", rank=chosen["rank"], min_compression_rate=chosen["min_compression_rate"],
                       seed=chosen["seed"], epsilon=chosen["epsilon"])
    try:
        inner_state = torch_powersgd.PowerSGDState(
            process_group, matrix_approximation_rank=chosen["rank"], start_powerSGD_iter=chosen["start_iter"],
            min_compression_rate=chosen["min_compression_rate"], use_error_feedback=memory == "residual",
            warm_start=bool(chosen["warm_start"]), orthogonalization_epsilon=chosen["epsilon"],
            random_seed=chosen["seed"], batch_tensors_with_same_shape=bool(chosen["batch_same_shape"]),
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad options for compressor 'powersgd': {exc}") from None
    return TorchHookState(name, torch_powersgd.powerSGD_hook, inner_state, process_group, _powersgd_sends,
                          log=collections.deque(maxlen=log_size)), torch_hook


def torch_hook(state: TorchHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Run PyTorch's hook for ``bucket`` unchanged and log the bucket (module docstring; the steps
    are comments in the body).

    Bytes: fp16/bf16 send 2 bytes per element; PowerSGD sends its uncompressed rest, P and Q in
    the bucket's dtype (:func:`compressors.powersgd.plan`, PyTorch's rule), or the dense bucket on
    its plain all-reduce steps.
    """
    start = time.perf_counter()
    buffer = bucket.buffer()
    iteration, index, numel = state.iteration, bucket.index(), buffer.numel()

    # Step I: count the step: after the bucket whose ``is_last()`` is true, ``state.iteration`` grows.
    if bucket.is_last():
        state.iteration += 1

    # Step II: what this bucket sends (log path, elements, bytes), by the rule chosen for this state.
    path, selected, payload = state.sends(state, bucket)

    # Step III: PyTorch's hook, unchanged.
    future = state.inner_hook(state.inner_state, bucket)

    # Step IV: once it completes, log the bucket (PyTorch's hook has averaged it already).
    def log(fut: torch.futures.Future) -> torch.Tensor:
        state.record({
            "iteration": iteration, "bucket": index, "path": path, "numel": numel,
            "selected": selected, "padded": selected, "bytes_sent": payload, "payload_bytes": payload, "compress_s": 0.0,
            "comm_s": time.perf_counter() - start,
        })
        return fut.value()

    return future.then(log)


def _cast_sends(state: TorchHookState, bucket: dist.GradBucket) -> tuple[str, int, int]:
    """fp16/bf16: the whole bucket cast to 2 bytes per element, all-reduced (path, elements, bytes)."""
    numel = bucket.buffer().numel()
    return f"allreduce-{state.name}", numel, numel * 2


def _powersgd_sends(state: TorchHookState, bucket: dist.GradBucket) -> tuple[str, int, int]:
    """PowerSGD: the dense bucket on its plain all-reduce steps (before ``start_iter``), else its
    uncompressed rest, P and Q in the bucket's dtype (path, elements, bytes). Refuses a second
    bucket on gloo, where PyTorch's hook hangs (:func:`comm_hook`'s docstring)."""
    buffer = bucket.buffer()
    numel = buffer.numel()
    if state.inner_state.iter < state.inner_state.start_powerSGD_iter:
        return "allreduce", numel, numel * buffer.element_size()
    if not (bucket.index() == 0 and bucket.is_last()) and dist.get_backend(state.process_group) == "gloo":
        raise ValueError("PyTorch's PowerSGD hook hangs on gloo with more than one bucket (it waits on "
                         "collectives inside future callbacks); give DistributedDataParallel a bucket_cap_mb "
                         "above the model size")
    shapes = [tuple(g.shape) for g in bucket.gradients()]
    blocks, rest, _ = powersgd_plan(shapes, numel, state.inner_state.matrix_approximation_rank,
                                    state.inner_state.min_compression_rate)
    selected = sum(n for _, n in rest) + sum((b.rows + b.cols) * b.rank for b in blocks)
    return "powersgd", selected, selected * buffer.element_size()
