"""Record gradients and timings from any PyTorch training loop.

>>> rec = Recorder(model, "traces/mine", every=10, batch_size=32)
>>> for x, y in loader:
...     optimizer.zero_grad()
...     loss_fn(model(x), y).backward()
...     rec.capture()                # copies the gradients when this iteration is recorded
...     with rec.optimizer():        # times the optimizer step
...         optimizer.step()
...     rec.step()                   # ends the iteration (writes its file when recorded)
>>> trace = rec.close()

Optionally, ``rec.count_flops(x)`` once (any time before :meth:`Recorder.close`) counts one
forward of the model on a batch, untimed, with PyTorch's FLOP counter
(:func:`traces.flops.count`), so the trace can be projected onto other devices by FLOPs.

Iterations are numbered from 1; iteration ``i`` is recorded when ``i % every == 0``.
For data parallelism simulated in one process call ``capture(worker=w)`` after each
worker's backward. Timings come from hooks: a forward pre-hook and hook on the
model, a hook on the model output's gradient (backward start) and a
post-accumulate-grad hook on every parameter (that layer's gradient is ready);
on CUDA they record events, on CPU ``time.perf_counter``. Hooks only act on
recorded iterations, so the other iterations run at full speed.

Per-layer backward time: the gaps between consecutive gradient-ready events are
summed per module (parameters sharing a name prefix, e.g. ``fc.weight`` and
``fc.bias``, whose gradients one autograd node produces) and split among that
module's parameters in proportion to their element counts; the times sum to
the backward pass up to the last gradient.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from traces.errors import TraceError
from traces.flops import ForwardFlops, count as count_forward_flops
from traces.format import TraceWriter
from traces.reader import Trace, open_trace


class _Clock:
    """Timestamps on CPU (``perf_counter`` seconds) or CUDA (events); ``seconds(a, b)`` = b − a."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        return end - start


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    if isinstance(value, Mapping):
        return _first_tensor(list(value.values()))
    return None


class Recorder:
    """Records every ``every``-th iteration's per-worker gradients and timings into a trace.

    ``model``: the module whose trainable parameters are recorded (in
    ``named_parameters`` order, the trace's layer order). ``workers``: how many
    gradients :meth:`capture` receives per iteration. ``batch_size``: samples per
    worker per step (stored in the timings). ``workload``: a name for the trace.
    ``extra``: more manifest fields.
    """

    def __init__(
        self,
        model: nn.Module,
        out_dir: str | os.PathLike[str],
        *,
        every: int = 10,
        workers: int = 1,
        batch_size: int | None = None,
        workload: str = "custom",
        overwrite: bool = False,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        if every < 1:
            raise TraceError(f"{out_dir}: every must be >= 1, got {every}")
        self.every = int(every)
        self.workers = int(workers)
        self.batch_size = batch_size
        self.extra = dict(extra or {})
        self.model = model
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not self.named:
            raise TraceError(f"{out_dir}: the model has no trainable parameters")
        self.device = self.named[0][1].device
        self._clock = _Clock(self.device)
        self._writer = TraceWriter(
            out_dir,
            workload=workload,
            layers=[(n, tuple(p.shape), str(p.dtype).removeprefix("torch.")) for n, p in self.named],
            workers=workers,
            overwrite=overwrite,
        )
        self._owners = [name.rpartition(".")[0] for name, _ in self.named]
        self._module_numel: dict[str, int] = {}
        for owner, (_, param) in zip(self._owners, self.named):
            self._module_numel[owner] = self._module_numel.get(owner, 0) + param.numel()
        self.iteration = 1
        self.trace: Trace | None = None
        self._handles: list[Any] = []
        self._ready: dict[int, Any] = {}
        self._marks: dict[str, Any] = {}
        self._grads: dict[int, torch.Tensor] = {}
        self._samples: list[dict[str, Any]] = []
        self._optimizer_s: list[float] = []
        self._flops: ForwardFlops | None = None
        self._counting = False
        self._handles.append(model.register_forward_pre_hook(self._on_forward_start))
        self._handles.append(model.register_forward_hook(self._on_forward_end))
        for index, (_, param) in enumerate(self.named):
            self._handles.append(param.register_post_accumulate_grad_hook(self._on_ready(index)))

    @property
    def recording(self) -> bool:
        """Whether the current iteration is one that is recorded."""
        return self.iteration % self.every == 0

    def _on_forward_start(self, module: nn.Module, inputs: Any) -> None:
        if self.recording and not self._counting:
            self._ready.clear()
            self._marks = {"forward_start": self._clock.mark()}

    def _on_forward_end(self, module: nn.Module, inputs: Any, output: Any) -> None:
        if not self.recording or self._counting:
            return
        self._marks["forward_end"] = self._clock.mark()
        tensor = _first_tensor(output)
        if tensor is not None and tensor.requires_grad:
            tensor.register_hook(self._on_backward_start)

    def _on_backward_start(self, grad: torch.Tensor) -> None:
        self._marks["backward_start"] = self._clock.mark()

    def _on_ready(self, index: int) -> Any:
        def hook(param: torch.Tensor) -> None:
            if self.recording:
                self._ready[index] = self._clock.mark()

        return hook

    def count_flops(self, *inputs: Any, batch_size: int | None = None) -> ForwardFlops:
        """Count the forward FLOPs of ``model(*inputs)`` per parameter (one batch of
        ``batch_size`` samples, default the recorder's), untimed and without side effects on
        training (:func:`traces.flops.count`); the trace stores them with its layers."""
        size = batch_size if batch_size is not None else self.batch_size
        if size is None:
            raise TraceError(f"{self._writer.out_dir}: count_flops needs the batch size (samples in the inputs)")
        self._counting = True
        try:
            self._flops = count_forward_flops(self.model, inputs, int(size))
        finally:
            self._counting = False
        return self._flops

    def capture(self, worker: int = 0) -> None:
        """After ``worker``'s backward: copy its gradients and timings if this iteration is recorded."""
        if not 0 <= worker < self.workers:
            raise TraceError(f"worker {worker} out of range for {self.workers} workers")
        if not self.recording:
            return
        if worker in self._grads:
            raise TraceError(f"worker {worker} captured twice in iteration {self.iteration}")
        self._grads[worker] = torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).float()
                for _, p in self.named
            ]
        ).cpu()
        self._samples.append(self._timing_sample(worker))

    def _timing_sample(self, worker: int) -> dict[str, Any]:
        marks = self._marks
        if "forward_end" not in marks:
            raise TraceError("capture() called without a forward pass of the recorded model in this iteration")
        start = marks.get("backward_start", marks["forward_end"])
        order = sorted(self._ready.items(), key=lambda item: self._clock.seconds(start, item[1]))
        module_s: dict[str, float] = {}
        previous = start
        for index, mark in order:
            owner = self._owners[index]
            module_s[owner] = module_s.get(owner, 0.0) + max(0.0, self._clock.seconds(previous, mark))
            previous = mark
        backward = [0.0] * len(self.named)
        for index, (_, param) in enumerate(self.named):
            owner = self._owners[index]
            if index in self._ready and owner in module_s:
                backward[index] = module_s[owner] * param.numel() / self._module_numel[owner]
        return {
            "iteration": self.iteration,
            "worker": worker,
            "forward_s": self._clock.seconds(marks["forward_start"], marks["forward_end"]),
            "backward_s": backward,
        }

    @contextmanager
    def optimizer(self) -> Iterator[None]:
        """Time the optimizer step run inside the block (on recorded iterations)."""
        if not self.recording:
            yield
            return
        start = self._clock.mark()
        yield
        self._optimizer_s.append(self._clock.seconds(start, self._clock.mark()))

    def step(self) -> None:
        """End the current iteration; on a recorded one write its gradients (all workers must be captured)."""
        if self.recording:
            missing = sorted(set(range(self.workers)) - set(self._grads))
            if missing:
                raise TraceError(f"iteration {self.iteration}: no gradient captured for worker(s) {missing}")
            self._writer.write_iteration(self.iteration, [self._grads[w] for w in range(self.workers)])
            self._grads.clear()
        self.iteration += 1

    def timings(self) -> dict[str, Any]:
        """Mean timings over the recorded (iteration, worker) passes, in seconds (trace manifest format)."""
        if not self._samples:
            raise TraceError(f"{self._writer.out_dir}: no iteration was recorded")
        count = len(self._samples)
        backward = [sum(s["backward_s"][i] for s in self._samples) / count for i in range(len(self.named))]
        return {
            "forward_s": sum(s["forward_s"] for s in self._samples) / count,
            "backward_s": backward,
            "backward_total_s": sum(backward),
            "optimizer_s": sum(self._optimizer_s) / len(self._optimizer_s) if self._optimizer_s else 0.0,
            "batch_size": self.batch_size,
            "device": str(self.device),
            "measured": True,
            "passes": count,
            "per_pass": [
                {"iteration": s["iteration"], "worker": s["worker"], "forward_s": s["forward_s"], "backward_s": sum(s["backward_s"])}
                for s in self._samples
            ],
        }

    def close(self, extra: Mapping[str, Any] | None = None) -> Trace:
        """Remove the hooks, write the manifest, move the trace into place and return it opened."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        try:
            timings = self.timings()
        except TraceError:
            self._writer.abort()
            raise
        path: Path = self._writer.close(timings=timings, extra={"every": self.every, **self.extra, **(extra or {})},
                                        flops=self._flops)
        self.trace = open_trace(path)
        return self.trace

    def abort(self) -> None:
        """Remove the hooks and discard everything recorded."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._writer.abort()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is not None:
            self.abort()
        elif self.trace is None:
            self.close()
