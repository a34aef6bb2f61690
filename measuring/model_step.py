"""The training step of a decoder-only transformer built from its config, timed.

The model is :func:`traces.workloads.llm.build`'s (the parameter names and shapes ``transformers``
registers, equal to :func:`traces.llm.tensors` row by row).

:func:`time_step` times one training step (forward, cross-entropy on the next token, backward,
AdamW) on synthetic tokens: ``warmup`` untimed steps, then ``repeats`` steps, each between two
device synchronisations (:func:`machine.timing.timed`). :func:`plan_layers` says how many layers
fit beside the rest when the whole model does not; :func:`measure` then times the model without
layers and with ``k`` of them and scales the layers' share to the full depth
(``step = t₀ + L/k · (t_k − t₀)``, :func:`scaled`). Units: seconds, bytes, samples, tokens.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.nn import functional as F

from machine.timing import timed
from traces.llm import Config, parameter_count
from traces.workloads.llm import build

ADAM_BYTES_PER_PARAMETER = 16
"""fp32 weight, gradient and AdamW's two moments: bytes per parameter of a step's states."""

ACTIVATION_BYTES_PER_TOKEN_HIDDEN = 34
"""Activation bytes kept for backward per token, per unit of hidden size and per layer in 16-bit
training (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
eq. 1, without the attention-score term that fused attention does not keep); doubled in fp32."""

LOGIT_COPIES = 3
"""fp32 copies of the logits a step holds at once (logits, their softmax, its gradient)."""

MEMORY_SHARE = 0.85
"""Share of the free device memory a planned step may take (the allocator's fragmentation and
the kernels' workspaces take the rest)."""


def step_bytes(config: Config, layers: int, batch_size: int, tokens: int, precision: str) -> int:
    """Bytes a training step of ``config`` with ``layers`` blocks holds at its peak (estimated):
    :data:`ADAM_BYTES_PER_PARAMETER` per parameter, the activations
    (:data:`ACTIVATION_BYTES_PER_TOKEN_HIDDEN` per token, hidden unit and layer, twice in fp32)
    and :data:`LOGIT_COPIES` fp32 copies of the logits."""
    params = parameter_count(replace(config, layers=layers))
    per_layer = ACTIVATION_BYTES_PER_TOKEN_HIDDEN * (1 if precision == "amp" else 2) * config.hidden
    tokens_in_step = batch_size * tokens
    return (ADAM_BYTES_PER_PARAMETER * params + per_layer * layers * tokens_in_step
            + LOGIT_COPIES * 4 * tokens_in_step * config.vocab)


def plan_layers(config: Config, batch_size: int, tokens: int, precision: str, free_bytes: int) -> int:
    """How many blocks a step may hold within :data:`MEMORY_SHARE` of ``free_bytes``: all of
    them when the whole model fits (:func:`step_bytes`), else the most that fit (0 when not even
    the embeddings and the head do)."""
    budget = MEMORY_SHARE * free_bytes
    if step_bytes(config, config.layers, batch_size, tokens, precision) <= budget:
        return config.layers
    fitting = [k for k in range(config.layers) if step_bytes(config, k, batch_size, tokens, precision) <= budget]
    return max(fitting, default=0)


@dataclass(frozen=True)
class StepTimes:
    """Seconds of each timed training step (``seconds``) of a model with ``layers`` blocks."""

    layers: int
    seconds: tuple[float, ...]

    @property
    def median_s(self) -> float:
        """The median step (seconds)."""
        return statistics.median(self.seconds)


def _precision(device: torch.device, precision: str) -> tuple[Any, torch.dtype | None]:
    """The autocast context of ``precision`` on ``device`` and its 16-bit dtype (``None`` in fp32,
    tf32): ``amp`` is bf16 autocast, fp16 where the GPU has no bf16 (a V100)."""
    if precision != "amp":
        return torch.autocast(device.type, enabled=False), None
    dtype = torch.bfloat16 if device.type == "cpu" or torch.cuda.is_bf16_supported() else torch.float16
    return torch.autocast(device.type, dtype=dtype), dtype


def time_step(config: Config, device: torch.device, layers: int, batch_size: int, tokens: int, precision: str,
              warmup: int, repeats: int, seed: int = 0, progress: Callable[[str], None] | None = None) -> StepTimes:
    """Time ``repeats`` training steps of ``config`` with ``layers`` blocks on ``device`` after
    ``warmup`` untimed ones: ``batch_size`` sequences of ``tokens`` seeded random tokens, forward
    in ``precision`` (:func:`_precision`; ``tf32`` turns on TF32 matmuls on a GPU), cross-entropy
    on the next token in fp32, backward, AdamW. Each step between two synchronisations of
    ``device`` (wall clock)."""
    model = build(config, device, layers, seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator(device=device).manual_seed(seed)
    batch = torch.randint(0, config.vocab, (batch_size, tokens + 1), device=device, generator=generator)
    inputs, targets = batch[:, :-1], batch[:, 1:]
    autocast, half = _precision(device, precision)
    scaler = torch.amp.GradScaler(device.type) if half is torch.float16 else None
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = model(inputs)
        loss = F.cross_entropy(logits.float().view(-1, config.vocab), targets.reshape(-1))
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        seconds = []
        for i in range(warmup + repeats):
            if progress:
                progress(f"{layers} layers, step {i + 1} of {warmup + repeats}" + (" (warm-up)" if i < warmup else ""))
            elapsed, _ = timed(step, time.perf_counter, sync)
            if i >= warmup:
                seconds.append(elapsed)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        del model, optimizer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return StepTimes(layers, tuple(seconds))


@dataclass(frozen=True)
class StepMeasurement:
    """A training step of the whole model, measured or scaled up: ``step_s`` (median seconds of
    a step at full depth), ``low_s``/``high_s`` (the fastest and slowest timed step, scaled alike),
    ``timed`` (the runs: the whole model, or the model without blocks and with ``layers_timed``
    of them), ``scale`` (full depth ÷ ``layers_timed``; 1 when the whole model ran), all
    seconds (:func:`scaled`)."""

    step_s: float
    low_s: float
    high_s: float
    layers_timed: int
    scale: float
    timed: tuple[StepTimes, ...]


def scaled(runs: tuple[StepTimes, ...], depth: int) -> StepMeasurement:
    """The full-depth step of ``runs``: the one run when it holds all ``depth`` blocks, else the
    run without blocks (t₀) and the one with k: ``t₀ + depth/k · (t_k − t₀)`` of their medians,
    its fastest and slowest step in the proportion of the k-block run's to its median (so that
    they bracket it whatever the noise of the difference)."""
    part = runs[-1]
    if len(runs) == 1:
        return StepMeasurement(part.median_s, min(part.seconds), max(part.seconds), part.layers, 1.0, runs)
    scale = depth / part.layers
    step = runs[0].median_s + scale * (part.median_s - runs[0].median_s)
    return StepMeasurement(step, step * min(part.seconds) / part.median_s, step * max(part.seconds) / part.median_s,
                           part.layers, scale, runs)


def measure(config: Config, device: torch.device, batch_size: int, tokens: int, precision: str, *,
            warmup: int, repeats: int, layers: int | None = None,
            progress: Callable[[str], None] | None = None) -> StepMeasurement:
    """The training step of the whole of ``config`` on ``device``: timed whole when ``layers``
    (``None``: :func:`plan_layers` on the device's free memory, halved while a step runs out of
    memory) is its depth, else timed without blocks and with ``layers`` of them and scaled up
    (:func:`scaled`). ValueError (one line) when not even the embeddings, the head and one block
    fit."""
    from machine.device import available_memory

    k = plan_layers(config, batch_size, tokens, precision, available_memory(device)) if layers is None else layers
    if not 1 <= k <= config.layers:
        need = step_bytes(config, 1, batch_size, tokens, precision)
        raise ValueError(f"one block of this model at batch {batch_size} and {tokens} tokens needs "
                         f"~{need / 2**30:,.1f} GiB with its embeddings and head (weights, gradients, AdamW states, "
                         f"activations), more than {device} has free: lower --batch-size or --tokens")
    while True:
        try:
            runs = (time_step(config, device, k, batch_size, tokens, precision, warmup, repeats, progress=progress),)
            break
        except torch.OutOfMemoryError:
            if layers is not None or k == 1:
                raise ValueError(f"a step of {k} of the model's {config.layers} layers at batch {batch_size} and "
                                 f"{tokens} tokens ran out of memory on {device}: give fewer --layers, or lower "
                                 "--batch-size or --tokens") from None
            k //= 2  # the estimate (step_bytes) was short: half as many layers
    if k < config.layers:
        runs = (time_step(config, device, 0, batch_size, tokens, precision, warmup, repeats, progress=progress), *runs)
    result = scaled(runs, config.layers)
    if not result.step_s > 0 or not math.isfinite(result.step_s):
        raise ValueError(f"the step scaled from {k} of {config.layers} layers is {result.step_s:.3g} s: the layers' "
                         "share is lost in the noise; time more layers (--layers) or more steps (--repeats)")
    return result
