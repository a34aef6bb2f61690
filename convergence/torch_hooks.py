"""PyTorch's own DDP hooks (fp16, bf16, PowerSGD) computed for W workers in one process.

``compressors.ddp.comm_hook`` delegates ``fp16``, ``bf16`` and ``powersgd`` to PyTorch's hooks
(torch 2.13, ``torch.distributed.algorithms.ddp_comm_hooks``). These functions compute, for one
bucket, what those hooks leave in every rank's bucket when ``W`` ranks run them, given each
rank's bucket buffer (not pre-divided, as DDP hands it over). An all-reduce is the sum of the
workers' tensors in rank order (exact for 2 ranks, where both orders give the same float sum),
divided where and as PyTorch divides:

- :func:`allreduce_mean` (``default_hooks.allreduce_hook``, PowerSGD's steps before
  ``start_powerSGD_iter``): each rank divides its buffer by W, then the sum;
- :func:`cast_mean` (``fp16_compress_hook`` / ``bf16_compress_hook``): each rank casts its
  buffer to the 16-bit dtype, divides it by W in that dtype, the sum is taken in that dtype
  (each addition rounded to it), and the result is cast back;
- :func:`powersgd_mean` (``powerSGD_hook``): see there.

The PowerSGD steps use :mod:`compressors.powersgd`'s layout, Q draw, orthogonalisation and factor
products (the compressor runs the same steps on one worker).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

from compressors.powersgd import (
    block_matrices,
    draw_q,
    expand,
    factor_views,
    gather_rest,
    left_factor,
    orthogonalize,
    plan,
    right_factor,
)


def _rank_sum(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The all-reduce's sum: a new tensor holding the tensors added in rank order."""
    total = tensors[0].clone()
    for tensor in tensors[1:]:
        total.add_(tensor)
    return total


def allreduce_mean(buffers: Sequence[torch.Tensor]) -> torch.Tensor:
    """PyTorch's plain averaging hook over the workers' ``buffers``: each divided by W, then summed."""
    world = len(buffers)
    return _rank_sum([buffer / world for buffer in buffers])


def cast_mean(buffers: Sequence[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """``fp16_compress_hook`` (``dtype=torch.float16``) / ``bf16_compress_hook`` (``torch.bfloat16``)
    over the workers' ``buffers``: cast, divide by W in ``dtype``, sum in ``dtype``, cast back."""
    world = len(buffers)
    return _rank_sum([buffer.to(dtype).div_(world) for buffer in buffers]).to(buffers[0].dtype)


def check_powersgd(state: PowerSGDState) -> None:
    """Raise ``ValueError`` if :func:`powersgd_mean` does not reproduce this configuration: only
    ``batch_tensors_with_same_shape`` (``comm_hook``'s ``batch_same_shape=True``), whose batched Q
    draw differs."""
    if state.batch_tensors_with_same_shape:
        raise ValueError("powersgd with batch_same_shape=True is not simulated; leave it False")


def powersgd_mean(states: Sequence[PowerSGDState], buffers: Sequence[torch.Tensor],
                  shapes: Sequence[Sequence[int]], index: int) -> torch.Tensor:
    """What ``powerSGD_hook`` leaves in bucket ``index`` on every rank; updates each rank's state.

    ``states[w]``: rank w's ``PowerSGDState`` (what ``comm_hook("powersgd", ...)`` built; its
    ``iter`` is not advanced here: the caller adds 1 after the step's last bucket, as the hook
    does). ``buffers[w]``: rank w's flat bucket; ``shapes``: the bucket's parameter shapes in order.

    Before ``start_powerSGD_iter``: :func:`allreduce_mean`. Then, per rank: add its error
    (``error_dict``) to its buffer and keep a copy; split it into matrices worth compressing and
    the uncompressed rest (:func:`compressors.powersgd.plan`); take Q (drawn from the rank's
    ``rng`` the first time or without warm start, else the kept Q re-orthogonalised) and
    ``P = M·Q``. The rest is all-reduced and divided by W; the P's are summed (not divided),
    orthogonalised, then each rank computes ``Q = Mᵀ·P``; the Q's are summed and divided by W.
    The bucket becomes ``P·Qᵀ`` per matrix and the averaged rest; each rank's error is its
    copy minus that. Q (and P) are kept for warm start; without it they are dropped.

    Raises ``ValueError`` for what it does not reproduce (:func:`check_powersgd`). Differs from
    PyTorch only where PyTorch would produce NaN: a zero column in the orthogonalisation becomes
    zeros here (:func:`compressors.powersgd.orthogonalize`).
    """
    lead = states[0]
    if lead.iter < lead.start_powerSGD_iter:
        return allreduce_mean(buffers)
    check_powersgd(lead)
    world = len(states)
    numel, dtype, device = buffers[0].numel(), buffers[0].dtype, buffers[0].device
    epsilon = lead.orthogonalization_epsilon
    blocks, rest_slices, _ = plan(shapes, numel, lead.matrix_approximation_rank, lead.min_compression_rate)
    inputs = []
    for state, buffer in zip(states, buffers):
        tensor = buffer.clone()
        if state.use_error_feedback:
            if index in state.error_dict:
                tensor.add_(state.error_dict[index])
            else:
                state.error_dict[index] = torch.zeros(numel, dtype=dtype, device=device)
        inputs.append(tensor)
    matrices = [block_matrices(tensor, blocks) for tensor in inputs]
    for state, worker_matrices in zip(states, matrices):
        if not state.warm_start or index not in state.p_memory_dict:
            state.p_memory_dict[index] = torch.empty(sum(b.rows * b.rank for b in blocks), dtype=dtype, device=device)
            state.q_memory_dict[index] = draw_q(state.rng, blocks, dtype, device, epsilon)
        else:
            for view in factor_views(state.q_memory_dict[index], blocks, "cols"):
                orthogonalize(view, epsilon)
        left_factor(worker_matrices, state.q_memory_dict[index], blocks, out=state.p_memory_dict[index])
    rest = _rank_sum([gather_rest(tensor, rest_slices) for tensor in inputs]).div_(world)
    p = _rank_sum([state.p_memory_dict[index] for state in states])
    for view in factor_views(p, blocks, "rows"):
        orthogonalize(view, epsilon)
    for state, worker_matrices in zip(states, matrices):
        state.p_memory_dict[index].copy_(p)
        right_factor(worker_matrices, p, blocks, out=state.q_memory_dict[index])
    q = _rank_sum([state.q_memory_dict[index] for state in states]).div_(world)
    result = expand(blocks, p, q, rest, rest_slices, torch.empty(numel, dtype=dtype, device=device))
    for state, tensor in zip(states, inputs):
        state.q_memory_dict[index].copy_(q)
        if state.use_error_feedback:
            state.error_dict[index] = tensor - result
        if not state.warm_start:
            state.p_memory_dict.clear()
            state.q_memory_dict.clear()
    return result
