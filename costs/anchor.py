"""Compute anchored on a measurement: a layout's single-GPU training throughput as the user measured it.

``--samples-per-s N`` at ``--batch-size B`` says one training iteration of ``B`` samples takes
``B / N`` seconds on one GPU. The simulator's single-GPU iteration of a layout is its forward
and backward FLOPs at one effective rate plus the optimizer step at the device's memory
bandwidth (:func:`simulator.workload.workload_from_layout`), so the measurement fixes the rate:

    rate = B · F / (B / N − optimizer_s)

with ``F`` the training FLOPs of one sample (3 × its forward FLOPs at ``tokens`` tokens,
:func:`costs.throughput.layout_flops`) and ``optimizer_s`` the layout's optimizer step on
the device (:func:`costs.throughput.optimizer_s`): projected on one node the iteration is
exactly ``B / N``. The rule fitted to published throughput is then not used, and its band with
it: what remains is the measurement's own noise, :data:`MEASUREMENT_NOISE`. Units: samples/s,
FLOP, FLOP/s, seconds.
"""

from __future__ import annotations

from costs import throughput
from costs.devices import Device

MEASUREMENT_NOISE = 0.05
"""Band (±, a fraction of compute time) on compute anchored on a measured throughput: stated,
not fitted. A throughput measured in one's own training loop on one's own GPU removes every
difference of harness, model code and software between the published rows and the user's run
(the published rows of the same model and GPU differ by up to 1.5× between harnesses,
docs/devices.md); left is what changes from run to run of that loop and between one GPU and
the data-parallel worker: clocks under power and thermal limits, the input pipeline, the
memory traffic of communication overlapping backward. ±5 % covers the spread of repeated
timings of one loop on one GPU; a measurement with a wider spread should widen it."""


def measured(layout: str, device: Device, batch_size: int, samples_per_s: float,
             tokens: int | None = None, precision: str = throughput.DEFAULT_PRECISION) -> throughput.Compute:
    """The compute of ``layout`` (at ``tokens`` tokens per sample) on ``device`` when one GPU
    trains ``samples_per_s`` samples/s at ``batch_size`` samples per iteration (the module
    docstring): its effective FLOP/s and the measurement's band (the note says when that rate is
    above the device's peak in ``precision``). ValueError when the optimizer step alone takes
    longer than the measured iteration."""
    iteration_s = batch_size / samples_per_s
    optimizer_s = throughput.optimizer_s(layout, device)
    if not iteration_s > optimizer_s:
        raise ValueError(f"--samples-per-s {samples_per_s:g} at batch {batch_size} is {iteration_s * 1e3:.3g} ms an "
                         f"iteration, less than {layout}'s optimizer step alone on {device.name} "
                         f"({optimizer_s * 1e3:.3g} ms): give the throughput measured at this --batch-size")
    flops = batch_size * throughput.layout_flops(layout, tokens) / (iteration_s - optimizer_s)
    low, high = 1.0 - MEASUREMENT_NOISE, 1.0 + MEASUREMENT_NOISE
    peak = device.peak_flops(precision)
    beyond = (f"; above {device.name}'s {device.dtype(precision)} peak of {peak / 1e12:.3g} TFLOP/s: check "
              "--batch-size, --tokens and --precision against the measurement" if flops > peak else "")
    note = (f"{flops / 1e12:.3g} TFLOP/s effective, from the measured {samples_per_s:g} samples/s at batch "
            f"{batch_size} (--samples-per-s: {iteration_s * 1e3:.4g} ms an iteration on one GPU, less the optimizer's "
            f"{optimizer_s * 1e3:.3g} ms at {device.name}'s bandwidth{beyond}); time band x{low:.2f}-{high:.2f}, "
            f"the measurement's noise (stated)")
    return throughput.Compute(flops_per_s=flops, low=low, high=high, unmeasured=(), note=note)
