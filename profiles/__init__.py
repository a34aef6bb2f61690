"""Device profiles shipped with the testbed: ``profiles/<device>.json`` in the format of
:mod:`costs.device_profile`, each saying in its ``source`` how and when it was measured.

A shipped CPU profile is named after the CPU it was measured on (``cpu-<model>.json``) and is
used for ``--device cpu`` only on a host with the same CPU model and SIMD flags.

``published-<gpu>.json`` hold published kernel timings of a GPU (kernel rows, each citing its
source); the GPU rules' bandwidth, launch and sync are fitted to them (:mod:`costs.published`).

``throughput.json`` is not a device profile: it holds published training throughput of several
harnesses, the anchors of the compute rule (:mod:`costs.throughput`); ``throughput-fit.json``
holds that rule's solved constants, leave-one-harness-out predictions and widening factors, keyed
by its inputs (``python -m costs.throughput`` writes it).

``kernel-evidence.json`` is not a device profile either: it holds published GPU kernel timings
fitted to nothing, on modelled GPUs and others, that check the cost model kind of kernel by
kind (:mod:`costs.kernel_bands`).

``sharded-throughput.json`` is not a device profile either: it holds published sharded-training
throughput (FSDP, HSDP, ZeRO, tensor/pipeline parallel) of several harnesses, each row citing its
source, against which projections are checked (:mod:`costs.sharded_fit`).

``quality.json`` is not a device profile either: it holds what every compressor sends of real
gradients per built-in workload and density, the quality ``sidco compare`` shows for layouts
(:mod:`pipeline.quality`; ``sidco quality-table`` writes it).
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
THROUGHPUT = HERE / "throughput.json"
THROUGHPUT_FIT = HERE / "throughput-fit.json"
KERNEL_EVIDENCE = HERE / "kernel-evidence.json"
QUALITY = HERE / "quality.json"
SHARDED_THROUGHPUT = HERE / "sharded-throughput.json"


def paths() -> list[Path]:
    """Every shipped profile file, sorted by name (the throughput tables, the fit, the kernel
    evidence and the quality table are none)."""
    return sorted(p for p in HERE.glob("*.json")
                  if p not in (THROUGHPUT, THROUGHPUT_FIT, KERNEL_EVIDENCE, QUALITY, SHARDED_THROUGHPUT))
