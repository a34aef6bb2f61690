"""Shared selection kernels: magnitude above a threshold, with reusable buffers and a
never-empty fallback.

Tie rule used by every threshold-based compressor built on :func:`select_above`: an element is
selected when ``|g| > threshold`` (strictly greater); elements exactly at the threshold stay.
"""

from __future__ import annotations

import torch


class Workspace:
    """Reusable scratch buffers keyed by (name, numel, dtype, device).

    A training loop compresses tensors of the same few sizes every step; reusing the buffers
    avoids re-allocating (and page-faulting) hundreds of megabytes per call.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}

    def get(self, name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Return a 1-D buffer of ``numel`` elements (contents undefined)."""
        key = (name, numel, dtype, device)
        buf = self._buffers.get(key)
        if buf is None:
            stale = [k for k in self._buffers if k[0] == name]
            if len(stale) >= 4:
                del self._buffers[stale[0]]
            buf = torch.empty(numel, dtype=dtype, device=device)
            self._buffers[key] = buf
        return buf


    def at_least(self, name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A view of ``numel`` elements into one growing buffer per (name, dtype, device).

        For outputs whose size changes from call to call (selections): the buffer grows by a
        quarter more than needed and is otherwise reused, so steady state allocates nothing.
        """
        key = (name, "grow", dtype, device)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel + numel // 4, dtype=dtype, device=device)
            self._buffers[key] = buf
        return buf[:numel]


def magnitude(grad: torch.Tensor, workspace: Workspace) -> torch.Tensor:
    """``|grad|`` written into a reused buffer of the same dtype."""
    buf = workspace.get("abs", grad.numel(), grad.dtype, grad.device)
    return torch.abs(grad, out=buf)


def indices_above(a: torch.Tensor, threshold: torch.Tensor | float, workspace: Workspace) -> torch.Tensor:
    """Positions (int64, ascending) where ``a > threshold`` (strict); may be empty.

    ``threshold`` may be a 0-d tensor on ``a``'s device (no device->host copy) or a float.
    The one device->host sync is the one sizing the output.
    """
    mask = workspace.get("mask", a.numel(), torch.bool, a.device)
    torch.gt(a, threshold, out=mask)
    return torch.nonzero(mask).squeeze(1)


def count_above(a: torch.Tensor, threshold: torch.Tensor | float, workspace: Workspace) -> int:
    """Number of elements with ``a > threshold`` (one device->host sync)."""
    mask = workspace.get("mask", a.numel(), torch.bool, a.device)
    torch.gt(a, threshold, out=mask)
    return int(torch.count_nonzero(mask))


def argmax_fallback(a: torch.Tensor) -> torch.Tensor:
    """The never-empty fallback: the single position of the largest ``a`` (lowest index among ties)."""
    return torch.argmax(a).reshape(1)
