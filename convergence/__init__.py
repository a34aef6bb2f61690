"""Convergence under compression: real training with W simulated data-parallel workers.

>>> from convergence import RunConfig, train
>>> rows = list(train(RunConfig("resnet20", workers=4, iterations=300, eval_every=50), "sidco-e", 0.01))

:mod:`convergence.workers` averages the workers' compressed gradients exactly as
``compressors.ddp.comm_hook`` does under DDP (:mod:`convergence.torch_hooks` for PyTorch's own
fp16, bf16 and PowerSGD hooks); :mod:`convergence.train` runs the training;
:mod:`convergence.tta` turns a convergence table and iteration times into time to target.
"""

from __future__ import annotations

from convergence.train import RunConfig, evaluate, train
from convergence.workers import SimulatedWorkers

__all__ = ["RunConfig", "SimulatedWorkers", "evaluate", "train"]
