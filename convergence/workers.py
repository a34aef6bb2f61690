"""W data-parallel workers in one process, averaging gradients exactly as the DDP hook does.

Every simulated worker owns the state :func:`compressors.ddp.comm_hook` would give its rank
(the hook's own :class:`~compressors.ddp.memory.BucketMemory`: a compressor and an
error-feedback memory per bucket, keyed by the bucket's parameters). Gradients are grouped
into buckets as ``DistributedDataParallel`` groups them (torch 2.13):

- first step: one bucket holding every parameter, in parameter order (DDP disables its
  initial bucketing unless it looks for unused parameters);
- from the second step on: buckets rebuilt from the order the gradients became ready in the
  first backward pass, with ``torch.distributed._compute_bucket_assignment_by_size`` and
  the limits DDP's reducer uses (first bucket ``first_bucket_bytes``, then
  ``bucket_cap_bytes``).

Per bucket, each worker compresses its bucket buffer (the concatenation of its parameters'
gradients, not pre-divided) through its slot; the update is the sum of the decompressed
messages in rank order (what the padded all-gather and the rank-by-rank scatter-add
compute; ``none`` sums the dense buffers as the all-reduce does) divided by the number of
workers, copied back into the parameters' ``.grad``. ``fp16``, ``bf16`` and ``powersgd``, whose
hooks are PyTorch's own, are computed as those hooks compute them across the workers
(:mod:`convergence.torch_hooks`), each worker keeping the PyTorch hook state of its rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import compressors.ddp
from compressors.ddp.memory import BucketMemory, layout_of
from convergence.torch_hooks import cast_mean, check_powersgd, powersgd_mean

DEFAULT_BUCKET_CAP_BYTES = 25 * 1024 * 1024
"""DDP's default ``bucket_cap_mb=25`` in bytes (DDP's MB is 2**20 bytes)."""
DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024
"""DDP's first-bucket cap when ``bucket_cap_mb`` is left at its default (bytes)."""


class SimulatedWorkers:
    """The gradient exchange of ``workers`` DDP ranks running ``comm_hook(name, density)``.

    ``params``: the model's trainable parameters (shared by all simulated workers: they
    hold the same replica). ``bucket_cap_bytes`` / ``first_bucket_bytes``: DDP's bucket caps
    in bytes (pass ``first_bucket_bytes=bucket_cap_bytes`` to mirror a DDP built with an
    explicit ``bucket_cap_mb``). ``hook_options``: keyword arguments of ``comm_hook``
    (``memory=``, compressor options).
    """

    def __init__(
        self,
        params: Sequence[nn.Parameter],
        name: str,
        density: float,
        workers: int,
        *,
        bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES,
        first_bucket_bytes: int = DEFAULT_FIRST_BUCKET_BYTES,
        **hook_options: Any,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if bucket_cap_bytes < 1 or first_bucket_bytes < 1:
            raise ValueError("bucket caps must be >= 1 byte")
        self.params = list(params)
        self.name = name
        self.workers = workers
        self.limits = [int(first_bucket_bytes), int(bucket_cap_bytes)]
        self.states = [compressors.ddp.comm_hook(name, density, **hook_options)[0] for _ in range(workers)]
        self.low_rank = compressors.message_kind(name) == "lowrank"  # PyTorch's PowerSGD hook
        if self.low_rank:
            check_powersgd(self.states[0].inner_state)
        self.buckets: list[list[int]] = [list(range(len(self.params)))]
        self.steps = 0
        self._ready: list[int] = []
        self._handles = [p.register_post_accumulate_grad_hook(self._on_ready(i)) for i, p in enumerate(self.params)]

    def _on_ready(self, index: int):
        def hook(_: torch.Tensor) -> None:
            if self.steps == 0 and index not in self._ready:
                self._ready.append(index)

        return hook

    def memories(self) -> list[BucketMemory]:
        """Each worker's per-bucket compressors and memories (the hook state's ``buckets``); empty
        for PyTorch's hooks, whose state is ``states[worker].inner_state`` (PowerSGD's ``PowerSGDState``)."""
        return [state.buckets for state in self.states if isinstance(state, compressors.ddp.CompressionHookState)]

    def exchange(self, grads: Sequence[Sequence[torch.Tensor]]) -> None:
        """Average ``grads[worker][param]`` through the compressors and set every ``param.grad``.

        ``grads`` holds each worker's gradients in parameter order (``None``-free). The
        step counters advance (``steps``, each hook state's ``iteration`` and PowerSGD's ``iter``,
        as the hook advances them after a step's last bucket); after the first step the buckets
        are rebuilt like DDP's.
        """
        if len(grads) != self.workers:
            raise ValueError(f"expected gradients of {self.workers} workers, got {len(grads)}")
        for index, members in enumerate(self.buckets):
            params = [self.params[i] for i in members]
            buffers = [torch.cat([grads[worker][i].reshape(-1) for i in members]) for worker in range(self.workers)]
            total = self._average(index, params, buffers)
            offset = 0
            for param in params:
                numel = param.numel()
                param.grad = total[offset : offset + numel].view_as(param).clone()
                offset += numel
        for state in self.states:
            state.iteration += 1
            if self.low_rank:
                state.inner_state.iter += 1
        self.steps += 1
        if self.steps == 1:
            self._rebuild()

    def _average(self, index: int, params: list[nn.Parameter], buffers: list[torch.Tensor]) -> torch.Tensor:
        """What every rank's hook leaves in bucket ``index`` given the workers' ``buffers``."""
        if compressors.message_kind(self.name) == "dense":  # PyTorch's fp16/bf16 hooks
            return cast_mean(buffers, compressors.compressor_class(self.name).wire_dtype)
        if self.low_rank:
            return powersgd_mean([state.inner_state for state in self.states], buffers,
                                 [tuple(p.shape) for p in params], index)
        layout = layout_of(params)
        total: torch.Tensor | None = None
        for buffer, state in zip(buffers, self.states):
            if self.name == "none":
                part = buffer
            else:
                slot = state.buckets.slot(layout, buffer, index)
                part = slot.compressor.decompress(slot.compress(buffer)).to(buffer.dtype)
            total = part.clone() if total is None else total.add_(part)
        assert total is not None
        return total.div_(self.workers)

    def _rebuild(self) -> None:
        order = self._ready + [i for i in range(len(self.params)) if i not in self._ready]
        tensors = [self.params[i] for i in order]
        assigned, _ = dist._compute_bucket_assignment_by_size(tensors, self.limits, [False] * len(tensors), order)
        self.buckets = [list(bucket) for bucket in assigned]

    def close(self) -> None:
        """Remove the gradient-ready hooks from the parameters."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
