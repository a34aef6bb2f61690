"""Memory per GPU of data-parallel training: the model states under DDP or sharded, activations, each compressor's state.

Every GPU holds a full replica under DDP (PyTorch ``DistributedDataParallel``, mixed precision by
``torch.autocast``, Adam), in bytes, for Ψ parameters:

- parameters, fp32: 4Ψ (autocast keeps the weights in fp32 and casts per operation);
- gradients, fp32: 4Ψ (``param.grad``);
- DDP's bucket buffers: 4Ψ (with ``gradient_as_bucket_view=False``, PyTorch's default, DDP copies
  the gradients into flat buckets: "the saved memory size will be equal to the total gradients
  size" when the views are on, PyTorch's ``DistributedDataParallel`` documentation);
- Adam's two moments (``exp_avg``, ``exp_avg_sq``), fp32: 8Ψ.

That is the 16Ψ of mixed-precision Adam in ZeRO's accounting (Rajbhandari et al. 2020, §3.1:
fp16 parameters and gradients 2Ψ + 2Ψ, fp32 parameters, momentum and variance 12Ψ; autocast keeps
4Ψ + 4Ψ + 8Ψ), plus DDP's buckets. The compressor adds its state (:func:`compressor_bytes`, the
DDP hooks of :mod:`compressors.ddp.hooks` with their defaults): the error-feedback residual of
every compressor of the testbed's hook, fp32, 4Ψ; PowerSGD (PyTorch's ``PowerSGDState`` with
``use_error_feedback`` and ``warm_start``): the residual 4Ψ and the warm-started factors P (n × r)
and Q (m × r) of every tensor of two or more dimensions viewed as n × m that it compresses
(:func:`powersgd_factor_bytes`), fp32; the casts and
``none`` nothing. Activations are not counted: a row that does not fit does not, one that fits
may still not once activations are added.

Sharded (``--parallel``, :func:`sharded_state_bytes`), by ZeRO's accounting of mixed-precision Adam
(Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
§5.1 and Figure 1: 2Ψ fp16 parameters + 2Ψ fp16 gradients + KΨ optimizer states, K = 12: fp32
parameters, momentum, variance) over N_d GPUs: ZeRO-1 shards the optimizer states
(2Ψ + 2Ψ + 12Ψ/N_d), ZeRO-2 the gradients too (2Ψ + 14Ψ/N_d), ZeRO-3 (FSDP) everything
(16Ψ/N_d; FSDP2 keeps fp32 sharded parameters and gradients and Adam's two moments, 4 + 4 + 8 = 16
bytes a parameter over the shard group as well); HSDP is FSDP with N_d the shard group. FSDP adds
its working set, the units gathered at once (:func:`simulator.sharded.working_numel`: the root and
two blocks, the one computing and the one prefetched) in the parameter dtype and their unsharded
gradients in the reduce dtype. The error-feedback residual sits on what the compressor compresses:
the whole gradient under DDP, the gradient shard (Ψ/N_d) under HSDP (its replicate exchange); under
FSDP and ZeRO nothing keeps one: the casts keep none, and a block quantizer goes into the
reduce-scatter as ZeRO++'s qgZ, which keeps no residual (Wang et al. 2023, §3.3).

Activations (:func:`activation_bytes`, for a model from its config): Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", §4.1 eq. (1): a transformer layer
stores s·b·h·(34 + 5·a·s/h) bytes of 16-bit activations for s tokens, micro-batch b, width h and a
heads; the 5·a·s/h term is the attention scores, which fused attention (FlashAttention, PyTorch's
scaled_dot_product_attention on these GPUs) does not store, so 34·s·b·h a layer. With full
activation checkpointing a layer keeps its 2·s·b·h input and one layer's 34·s·b·h is live while it
is recomputed (§4.2). The logits for the loss add s·b·V·4 bytes (fp32, V the vocabulary).

The device's memory is its data sheet's capacity (:data:`CAPACITY_BYTES`, decimal gigabytes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from compressors import message_kind
from compressors.rules import trains_with_error_feedback
from units import check_count

GIB = 1 << 30
"""Bytes per GiB (what ``memory_gib`` counts in)."""

STATE_BYTES_PER_PARAMETER: dict[str, int] = {"parameters": 4, "gradients": 4, "ddp_buckets": 4, "adam": 8}
"""Bytes per parameter of each model state under DDP (the module docstring has the sources)."""

RESIDUAL_BYTES_PER_PARAMETER = 4
"""The fp32 error-feedback residual, bytes per parameter."""

CAPACITY_BYTES: dict[str, int] = {
    "v100": 32 * 10**9,   # NVIDIA Tesla V100 data sheet: 32 GB HBM2 (SXM2)
    "a100": 80 * 10**9,   # NVIDIA A100 Tensor Core GPU data sheet: 80 GB HBM2e
    "h100": 80 * 10**9,   # NVIDIA H100 Tensor Core GPU data sheet (SXM): 80 GB HBM3
    "h200": 141 * 10**9,  # NVIDIA H200 Tensor Core GPU data sheet: 141 GB HBM3e
}
"""Device memory (bytes) of each modelled GPU, from its data sheet."""


def model_state_bytes(numel: int) -> dict[str, int]:
    """Bytes per GPU of each model state of :data:`STATE_BYTES_PER_PARAMETER` for ``numel`` parameters."""
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise ValueError(f"numel must be a whole number >= 0, got {numel!r}")
    return {part: per * numel for part, per in STATE_BYTES_PER_PARAMETER.items()}


POWERSGD_MIN_COMPRESSION_RATE = 2.0
"""PyTorch's ``PowerSGDState`` default: a matrix is compressed only when that makes it this much smaller."""


def powersgd_factor_bytes(shapes: Sequence[Sequence[int] | None], rank: int,
                          min_compression_rate: float = POWERSGD_MIN_COMPRESSION_RATE) -> int:
    """Bytes of PowerSGD's warm-started P and Q (fp32) at ``rank`` for tensors of ``shapes``, by PyTorch's
    ``powerSGD_hook``: a tensor of two or more dimensions viewed as n × m, at rank r' = min(n, m, ``rank``),
    keeps (n + m) × r' when (n + m) × r' × ``min_compression_rate`` < n × m; others (and 1-D tensors) none."""
    check_count(rank, "PowerSGD's rank")
    total = 0
    for shape in shapes:
        if shape is not None and len(shape) >= 2:
            n = int(shape[0])
            m = math.prod(shape) // n
            r = min(n, m, rank)
            if (n + m) * r * min_compression_rate < n * m:
                total += (n + m) * r
    return 4 * total


def compressor_bytes(compressor: str, numel: int, shapes: Sequence[Sequence[int] | None], rank: int = 1) -> int:
    """Bytes per GPU of ``compressor``'s state in the DDP hook for ``numel`` parameters of ``shapes``
    (the module docstring): none for ``none`` and the casts, the residual for the rest, PowerSGD's
    factors besides."""
    if not trains_with_error_feedback(compressor):  # its card: no residual (none, the casts)
        return 0
    residual = RESIDUAL_BYTES_PER_PARAMETER * numel
    return residual + (powersgd_factor_bytes(shapes, rank) if message_kind(compressor) == "lowrank" else 0)


SHARDED_BYTES_PER_PARAMETER: dict[str, int] = {"parameters": 2, "gradients": 2, "optimizer": 12}
"""ZeRO's mixed-precision Adam, bytes per parameter (Rajbhandari et al. 2020, §5.1: 2 + 2 + K, K = 12)."""

SHARDED_PARTS: dict[str, tuple[str, ...]] = {
    "zero1": ("optimizer",),
    "zero2": ("gradients", "optimizer"),
    "fsdp": ("parameters", "gradients", "optimizer"),
    "hsdp": ("parameters", "gradients", "optimizer"),
}
"""Which model states each ``--parallel`` shards (ZeRO stages 1, 2 and 3; FSDP is stage 3)."""

ACTIVATION_BYTES_PER_TOKEN_WIDTH = 34
"""Korthikanti et al. 2022, eq. (1) without the attention scores: bytes per token per unit of width a layer stores."""

CHECKPOINT_BYTES_PER_TOKEN_WIDTH = 2
"""A checkpointed layer's stored input (16-bit), bytes per token per unit of width (Korthikanti et al. 2022, §4.2)."""

LOGIT_BYTES = 4
"""fp32 logits per token per vocabulary entry."""


def sharded_state_bytes(parallel: str, numel: int, shard: int, working_param_bytes: int = 0,
                        working_grad_bytes: int = 0) -> dict[str, float]:
    """Bytes per GPU of each model state under ``parallel`` (``zero1``, ``zero2``, ``fsdp``, ``hsdp``)
    for ``numel`` parameters sharded over ``shard`` GPUs (:data:`SHARDED_PARTS`), plus FSDP's
    working set: ``working_param_bytes`` gathered parameters and ``working_grad_bytes`` unsharded
    gradients (bytes)."""
    if parallel not in SHARDED_PARTS:
        raise ValueError(f"no sharded accounting for --parallel {parallel!r}; choose from {', '.join(SHARDED_PARTS)}")
    model_state_bytes(numel)
    check_count(shard, "GPUs a model state is sharded over")
    out: dict[str, float] = {}
    for part, per in SHARDED_BYTES_PER_PARAMETER.items():
        out[part] = per * numel / (shard if part in SHARDED_PARTS[parallel] else 1)
    if parallel in ("fsdp", "hsdp"):
        out["gathered_parameters"] = float(working_param_bytes)
        out["unsharded_gradients"] = float(working_grad_bytes)
    return out


def activation_bytes(layers: int, hidden: int, vocab: int, tokens: int, micro_batch: int,
                     checkpointing: bool = False) -> float:
    """Bytes of activations one GPU holds at the peak of a micro-batch's backward: ``layers``
    transformer layers of width ``hidden`` at ``tokens`` tokens × ``micro_batch`` sequences (the
    module docstring: 34·s·b·h a layer, or 2·s·b·h with checkpointing plus one layer recomputed),
    and the fp32 logits over ``vocab``."""
    for value, what in ((layers, "layers"), (hidden, "hidden size"), (vocab, "vocabulary"), (tokens, "tokens"),
                        (micro_batch, "micro-batch")):
        check_count(value, what)
    sbh = tokens * micro_batch * hidden
    full = ACTIVATION_BYTES_PER_TOKEN_WIDTH * sbh
    stored = layers * CHECKPOINT_BYTES_PER_TOKEN_WIDTH * sbh + full if checkpointing else layers * full
    return float(stored + LOGIT_BYTES * tokens * micro_batch * vocab)


def capacity(device: str) -> int | None:
    """Memory (bytes) of GPU ``device`` (a name, ``h100@era`` as ``h100``), ``None`` for another device."""
    return CAPACITY_BYTES.get(device.split("@", 1)[0])


def per_gpu(compressor: str, numel: int, shapes: Sequence[Sequence[int] | None], device: str,
            rank: int = 1, *, parallel: str = "ddp", shard: int = 1, working_param_bytes: int = 0,
            working_grad_bytes: int = 0, activations: float | None = None) -> dict[str, Any]:
    """Memory per GPU: ``memory_gib`` (model states under ``parallel``, sharded over ``shard``
    GPUs with FSDP's working set in bytes, :func:`sharded_state_bytes`; ``compressor``'s state, on
    the gradient shard under HSDP, none under FSDP and ZeRO (the module docstring); ``activations``
    in bytes when known, :func:`activation_bytes`;
    GiB), ``memory_parts_gib`` (each part), ``activations_counted``, ``memory_capacity_gib`` (the
    ``device``'s, ``None`` when not a modelled GPU) and ``fits`` (``memory_gib`` within it;
    ``None`` when unknown). Under DDP (the default) the states of :func:`model_state_bytes`."""
    if parallel == "ddp":
        parts: dict[str, float] = {k: float(v) for k, v in model_state_bytes(numel).items()}
        parts["compressor"] = float(compressor_bytes(compressor, numel, shapes, rank))
    else:
        parts = sharded_state_bytes(parallel, numel, shard, working_param_bytes, working_grad_bytes)
        parts["compressor"] = 0.0
        if parallel == "hsdp":
            shard_shapes = [None if s is None else (math.ceil(s[0] / shard), *s[1:]) for s in shapes]
            parts["compressor"] = float(compressor_bytes(compressor, math.ceil(numel / shard), shard_shapes, rank))
    if activations is not None:
        parts["activations"] = float(activations)
    total = sum(parts.values())
    room = capacity(device)
    return {"memory_gib": total / GIB, "memory_parts_gib": {k: v / GIB for k, v in parts.items()},
            "activations_counted": activations is not None,
            "memory_capacity_gib": None if room is None else room / GIB,
            "fits": None if room is None else total <= room}
