"""The one rule for which kernels serve a threshold compressor's call: its ``backend`` option
(``"auto"``, ``"torch"`` or ``"fused"``), checked by :func:`check`, and the path a tensor takes,
:func:`path`.

- ``"auto"``: the fused C kernels of :mod:`compressors.kernels.native` on a contiguous float32 CPU
  tensor where they are built; the fused Triton kernels of :mod:`compressors.kernels.fused` on a
  CUDA tensor they serve when Triton (the ``gpu`` extra) is installed; torch otherwise.
- ``"torch"``: always torch.
- ``"fused"``: the Triton kernels wherever they serve the tensor (also CPU tensors under
  ``TRITON_INTERPRET=1``, as the tests run them), torch elsewhere (float64); needs Triton.

SIDCo (:mod:`compressors.sidco`), DGC, Gaussian-k and RedSync take this option, and the selection
primitive (:func:`compressors.numerics.selection.select_above`) follows :func:`path`. Triton is
imported only where the fused kernels are asked for or a CUDA tensor is served.
"""

from __future__ import annotations

import torch

from compressors.kernels import native

CHOICES = ("auto", "torch", "fused")
"""The values of a compressor's ``backend`` option."""


def triton_present() -> bool:
    """Whether Triton (the ``gpu`` extra) is installed, for the fused kernels."""
    from compressors.kernels import fused  # imports Triton: only where the fused kernels are asked for

    return fused.available()


def check(backend: str) -> str:
    """``backend`` when it is one of :data:`CHOICES` (``"fused"`` only with Triton installed);
    ``ValueError`` otherwise."""
    if backend not in CHOICES:
        raise ValueError(f"backend must be 'auto', 'torch' or 'fused', got {backend!r}")
    if backend == "fused" and not triton_present():
        raise ValueError("backend 'fused' needs Triton: pip install '.[gpu]'")
    return backend


def fused_serves(x: torch.Tensor) -> bool:
    """Whether the Triton kernels serve ``x`` (:func:`compressors.kernels.fused.serves`: Triton
    present, a contiguous float32/16/bf16 tensor of fewer than 2³¹ elements on a GPU, or on the CPU
    under the interpreter)."""
    from compressors.kernels import fused  # imports Triton: only where it is asked

    return fused.serves(x)


def path(x: torch.Tensor, backend: str = "auto") -> str:
    """The kernels that serve ``x`` under option ``backend`` (module docstring): ``"native"``,
    ``"fused"`` or ``"torch"`` (torch ops, on whatever device ``x`` is)."""
    if backend == "torch":
        return "torch"
    if backend == "auto" and native.usable(x):
        return "native"
    if (backend == "fused" or x.is_cuda) and fused_serves(x):
        return "fused"
    return "torch"


__all__ = ["CHOICES", "check", "fused_serves", "path", "triton_present"]
