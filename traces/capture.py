"""Capture a trace from a built-in workload with data parallelism simulated in one process.

Each iteration, each of ``workers`` workers runs forward and backward on its own
data shard; the :class:`~traces.recorder.Recorder` copies every worker's
gradient on recorded iterations; the workers' gradients are averaged (what an
all-reduce would produce) and one optimizer step updates the shared model.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import torch

from machine.device import available_memory, resolve as resolve_device

from traces import workloads
from traces.errors import TraceError
from traces.format import check_out
from traces.reader import Trace
from traces.recorder import Recorder


def check_memory(workload: str, width: float | None, workers: int, device: str) -> None:
    """Raise :class:`TraceError` (one line) when the model at ``width`` cannot fit: parameters,
    gradients, momentum and the gradient sum (4 fp32 copies) plus one recorded gradient per worker."""
    if width is not None and not (math.isfinite(width) and width > 0):
        raise TraceError(f"--width must be a finite number > 0, got {width}")
    spec_width = workloads.SPECS[workload].width if workload in workloads.SPECS else 1.0
    params = workloads.parameter_count(workload, spec_width if width is None else float(width))
    need = 4 * params * (4 + workers)
    free = available_memory(device)
    if need > free:
        raise TraceError(f"{workload} at width {width if width is not None else spec_width:g} has {params:,} parameters: "
                         f"capturing {workers} workers needs ~{need / 2**30:,.1f} GiB, {device} has "
                         f"{free / 2**30:,.1f} GiB free; lower --width or --workers")


PROBE_SAMPLES = 2
"""Samples of the untimed training step that measures a workload's memory per sample."""


def bytes_per_sample(work: workloads.Workload) -> int:
    """Bytes one sample of a batch holds during a training step of ``work``'s model: its input
    plus the activations autograd saves for the backward pass, measured on a fresh copy of the
    model (``work.model`` is untouched) over :data:`PROBE_SAMPLES` samples; parameters saved by
    layers are not counted (they do not grow with the batch)."""
    model = work.build_model()
    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    inputs, targets = next(work.batches(0, 1, batch_size=PROBE_SAMPLES))
    total = [inputs.numel() * inputs.element_size()]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in params:
            total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = work.loss(model(inputs), targets)
    del loss, model
    return max(1, total[0] // PROBE_SAMPLES)


def check_batch_memory(work: workloads.Workload) -> None:
    """Raise :class:`TraceError` (one line) before any batch is drawn when a batch of
    ``work.batch_size`` samples cannot fit: twice :func:`bytes_per_sample` per sample (the saved
    activations and their gradients in the backward pass)."""
    per_sample = bytes_per_sample(work)
    need = 2 * per_sample * work.batch_size
    free = available_memory(work.device)
    if need > free:
        raise TraceError(f"batch size {work.batch_size:,} of {work.name} needs ~{need / 2**30:,.1f} GiB "
                         f"(~{per_sample / 2**20:,.1f} MiB per sample, measured), {work.device} has "
                         f"{free / 2**30:,.1f} GiB free; lower --batch-size")


def check_request(workload: str, *, workers: int, iterations: int, every: int, device: str,
                  width: float | None = None, batch_size: int | None = None, lr: float | None = None,
                  out: str | os.PathLike[str] | None = None, overwrite: bool = False) -> str:
    """Check a capture's arguments before anything is built or written; return the device name.
    ``out``, when given, is the trace directory to write (:func:`traces.format.check_out`, with
    ``overwrite``).

    Raises :class:`TraceError` (one line) naming the first bad argument."""
    if workload not in workloads.SPECS:
        raise TraceError(f"unknown workload {workload!r}; choose one of {', '.join(workloads.names())}")
    if workers < 1:
        raise TraceError(f"workers must be >= 1, got {workers}")
    if iterations < 1:
        raise TraceError(f"iterations must be >= 1, got {iterations}")
    if not 1 <= every <= iterations:
        raise TraceError(f"every must be between 1 and iterations ({iterations}), got {every}")
    if batch_size is not None and batch_size < 1:
        raise TraceError(f"batch size must be >= 1, got {batch_size}")
    if lr is not None and not (math.isfinite(lr) and lr > 0):
        raise TraceError(f"learning rate must be a finite number > 0, got {lr}")
    try:
        device = str(resolve_device(device))
    except ValueError as exc:
        raise TraceError(str(exc)) from None
    check_memory(workload, width, workers, device)
    if out is not None:
        check_out(out, overwrite=overwrite)
    return device


def capture(
    workload: str,
    out_dir: str | os.PathLike[str],
    *,
    workers: int = 4,
    iterations: int = 200,
    every: int = 10,
    device: str = "cpu",
    seed: int = 0,
    width: float | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    overwrite: bool = False,
    progress: Callable[[int, float], None] | None = None,
    data: str | None = None,
) -> Trace:
    """Train ``workload`` for ``iterations`` steps and record every ``every``-th; return the trace.

    ``batch_size`` is per worker (samples); ``progress(iteration, mean_loss)`` is
    called after each step. Unset knobs take the workload's CPU defaults; ``data``: what it trains
    on (:func:`traces.workloads.data_source`; ``None``: the workload's default). The forward FLOPs
    of worker 0's first batch are counted once, untimed (:meth:`Recorder.count_flops`).
    """
    device = check_request(workload, workers=workers, iterations=iterations, every=every, device=device,
                           width=width, batch_size=batch_size, lr=lr)
    work = workloads.build(workload, width=width, batch_size=batch_size, lr=lr, seed=seed, device=device, data=data)
    check_batch_memory(work)
    model, optimizer = work.model, work.optimizer()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    totals = [torch.zeros_like(p) for p in params]
    shards = [work.batches(w, workers) for w in range(workers)]
    losses: list[float] = []
    recorder = Recorder(
        model,
        out_dir,
        every=every,
        workers=workers,
        batch_size=work.batch_size,
        workload=workload,
        overwrite=overwrite,
        extra={
            "capture": {
                "seed": seed,
                "data": work.data_name,
                "width": work.width,
                "lr": work.lr,
                "optimizer": "SGD(momentum=0.9)",
                "iterations": iterations,
                "parallelism": "simulated data parallel (one process, averaged gradients)",
            }
        },
    )
    with recorder:
        recorder.count_flops(next(work.batches(0, workers))[0])
        for _ in range(iterations):
            for total in totals:
                total.zero_()
            loss_sum = 0.0
            for worker, shard in enumerate(shards):
                inputs, targets = next(shard)
                optimizer.zero_grad(set_to_none=True)
                loss = work.loss(model(inputs), targets)
                loss.backward()
                recorder.capture(worker)
                for total, param in zip(totals, params):
                    if param.grad is not None:
                        total.add_(param.grad)
                loss_sum += float(loss.detach())
            for total, param in zip(totals, params):
                param.grad = total / workers
            with recorder.optimizer():
                optimizer.step()
            losses.append(loss_sum / workers)
            if not math.isfinite(losses[-1]):
                raise TraceError(f"{out_dir}: training diverged at iteration {recorder.iteration} (loss not finite); lower --lr")
            if progress is not None:
                progress(recorder.iteration, losses[-1])
            recorder.step()
        return recorder.close(extra={"loss": {"first": losses[0], "last": losses[-1], "per_iteration": losses}})
