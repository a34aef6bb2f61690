"""Convergence under compression: real training with W simulated data-parallel workers.

>>> from convergence import RunConfig, train
>>> rows = list(train(RunConfig("resnet20", workers=4, iterations=300, eval_every=50), "sidco-e", 0.01))

:mod:`convergence.workers` averages the workers' compressed gradients exactly as
``compressors.ddp.comm_hook`` does under DDP (:mod:`convergence.torch_hooks` for PyTorch's own
fp16, bf16 and PowerSGD hooks); :mod:`convergence.train` runs the training;
:mod:`convergence.diloco` trains W sites that synchronise every H
steps (DiLoCo: inner optimizer, outer Nesterov step on the compressed pseudo-gradients, with
the optimizers of :mod:`convergence.optim`); :mod:`convergence.penalty` measures what that costs in
held-out loss against synchronous training at equal tokens; :mod:`convergence.tta` turns a convergence table and iteration times into time to target.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__all__ = ["RunConfig", "SimulatedWorkers", "evaluate", "train", "train_diloco"]

_LAZY = {"RunConfig": "convergence.train", "evaluate": "convergence.train", "train": "convergence.train",
         "SimulatedWorkers": "convergence.workers", "train_diloco": "convergence.diloco"}
"""Exports imported (with torch) on first use: :mod:`convergence.tta`, which time-to-target
projections and ``sidco sweep`` need, is arithmetic on stored rows and loads no torch."""


class _Package(types.ModuleType):
    """This package, whose ``train`` stays the function even after :mod:`convergence.train` is
    imported (importing a submodule would otherwise rebind the name to the module)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "train" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(attr: str) -> Any:
    if attr in _LAZY:
        return getattr(importlib.import_module(_LAZY[attr]), attr)
    raise AttributeError(f"module 'convergence' has no attribute {attr!r}")
