"""The testbed's projection of each published sharded-training row (``profiles/sharded-throughput.json``).

:func:`projection` is the function :func:`costs.sharded_fit.check` takes: a row's model (a shipped
model, or the config the row states), its device in bf16 mixed precision, its GPUs as nodes of
:data:`GPUS_PER_NODE` on the ``hierarchical`` topology, its sequences per GPU per optimizer step in
its micro-batches at its sequence length, under its ``--parallel`` plan (:func:`sharding`:
:mod:`simulator.sharded`), projected one iteration with ``--fidelity analytic``; tokens/s per GPU =
sequences per GPU × tokens ÷ iteration seconds. A row the model cannot project says why instead
(FP8 training, tensor, pipeline or context parallelism, no stated shapes). ``python -m
pipeline.published_sharded`` prints the table of docs/devices.md. Units: bits/s, seconds, tokens/s
per GPU.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import simulator
from simulator.sharded import Sharding
from costs import sharded_fit
from costs.sharded_fit import Row
from pipeline.project import resolve
from pipeline.request import WorkloadRequest

GPUS_PER_NODE = 8
"""GPUs per node of every row (DGX / HGX nodes of 8, as every source states or implies)."""

NETWORK_BPS = {"a100": 200e9, "h100": 400e9}
"""Inter-node bandwidth per GPU (bits/s) where a row does not give one the model can use: the
reference fabrics of NVIDIA's DGX A100 (8 × 200 Gbit/s HDR InfiniBand; llm-foundry's A100 tables
state 1,600 Gbit/s per node) and DGX H100 (8 × 400 Gbit/s NDR; torchtitan states 400 Gbit/s per GPU)."""

LATENCY_S = 5e-6
"""One-way latency of an inter-node message (seconds)."""


def why_not(row: Row) -> str | None:
    """Why the model cannot project ``row`` (``None`` when it can)."""
    if row.config is None:
        return "no stated shapes"
    if row.precision == "fp8":
        return "fp8: not a modelled precision"
    if row.parallel == "tp-pp" or row.data_parallel != row.gpus:
        return "tensor/pipeline/context parallel: not modelled"
    return None


def sharding(row: Row) -> Sharding:
    """The row's ``--parallel`` plan: ``dp`` as DDP, FSDP's SHARD_GRAD_OP as ZeRO-2, its micro-batch,
    full activation checkpointing as per-block recompute (selective checkpointing is not modelled:
    no recompute), gradients reduced in fp32 (FSDP's and torchtitan's default)."""
    return Sharding(parallel="ddp" if row.parallel == "dp" else row.parallel, micro_batch=row.micro_batch,
                    checkpointing=row.activation_checkpointing is True)


def _project(model: str, row: Row) -> float:
    batch = round(row.batch)
    source = resolve(WorkloadRequest(model=model, device=row.device, precision="amp", batch_size=batch,
                                     tokens=row.tokens))
    scenario = simulator.Scenario(source.workload, max(1, row.gpus // GPUS_PER_NODE), NETWORK_BPS[row.device],
                                  LATENCY_S, "none", topology="hierarchical",
                                  gpus_per_node=min(row.gpus, GPUS_PER_NODE), sharding=sharding(row))
    return batch * row.tokens / simulator.simulate(scenario)["iteration_s"]


def projection(row: Row) -> float | str:
    """Tokens/s per GPU the testbed projects for ``row``, or why it does not."""
    reason = why_not(row)
    if reason:
        return reason
    if isinstance(row.config, str):
        return _project(row.config, row)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.json"
        path.write_text(json.dumps(dict(row.config)))
        return _project(str(path), row)


def report() -> str:
    """The table of docs/devices.md: every shipped row against :func:`projection`."""
    return sharded_fit.report(sharded_fit.check(projection))


if __name__ == "__main__":
    print(report())
