"""The DDP side of compression: the communication hooks (:mod:`compressors.ddp.hooks`, exported
here, imported with torch on first use), the hooks' memory per bucket (:mod:`compressors.ddp.memory`),
the sparse exchange (:mod:`compressors.ddp.exchange`) and DDP's bucket rule
(:mod:`compressors.ddp.buckets`, torch-free: the simulator lays gradients out with it)."""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(attr: str) -> Any:
    """The hooks' names (``comm_hook``, ``TORCH_HOOKS``, …), from :mod:`compressors.ddp.hooks`."""
    return getattr(importlib.import_module("compressors.ddp.hooks"), attr)
