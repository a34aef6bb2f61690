"""Measuring a device profile: steady-state compress/decompress times of compressors.

Each (compressor, density, size) runs with the memory training gives it
(error feedback, except for ``none``, fp16 and bf16: :func:`as_trained`), on a rotation of seeded gradient-like vectors and output buffers (:func:`rotation`: so
thresholds and residuals move as they do between iterations, and each call finds its gradient and
its output evicted, as after a backward pass), after ``warmup`` untimed calls (adaptive SIDCo settles its stage
count), timing ``repeats`` calls device-synchronised (on a CPU with one thread by the process's
CPU time, :func:`measuring.host.host_clock`, so that other work on a shared machine does not
inflate them). Rows keep the median call as ``compress_s``/``decompress_s`` (a call that ran:
the typical cost, fresh-page faults and data-dependent loops included as often as they occur;
the fastest call skips them when it is lucky) and add the fastest and the slowest. Every call is
reseeded (``reseed(call)``), so a second, untimed run of the same sequence with the op recorder
(:func:`compressors.work.counting.record_ops`) makes the same calls: for the compressors whose work depends
on the data (Gaussian-k's corrections, RedSync's probes, DGC's lowerings and trim, Top-k's
halvings, Random-k's draws, SIDCo's stages, pool, passes and correction steps) a row carries the
loop counts of the very call it reports, so the cost model is checked with the loops that ran. Nothing else in the testbed times compressors
implicitly: this runs only from ``sidco profile``.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

import compressors
from compressors.rules import trains_with_error_feedback
from compressors.work import FUSED, counting
from costs import devices
from costs.costmodel import backend_on
from costs.device_profile import DeviceProfile
from machine import host_identity, host_key
from machine.timing import no_sync, timed
from measuring.host import MMAP_THRESHOLD_BYTES, host_cache_bytes, host_clock
from measuring.samples import gradient_like
from processes import children

AS_TRAINED = "as trained: on, except for none, fp16 and bf16"
"""A profile's ``method.error_feedback``: each compressor with the memory training gives it
(profiles measured before 2026-12-01 say ``true``: error feedback around every compressor)."""

GPU_NAMES = devices.cuda_names()
"""Device name by the part of a CUDA device's name that names it, from the device files
(``profiles/devices/<name>.json``, :func:`costs.devices.cuda_names`)."""


def pin_threads(threads: int) -> list[int]:
    """Run torch (and the native kernels) on ``threads`` threads pinned to the first ``threads``
    CPUs this process may use; returns those CPUs."""
    if threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    torch.set_num_threads(threads)
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    chosen = allowed[:threads]
    if chosen and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, chosen)
    return chosen


def torch_device(device: str) -> torch.device:
    """``device`` as a torch device that can be measured here; ValueError (one line) otherwise."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"bad device {device!r}: give cpu, cuda or cuda:N ({str(exc).splitlines()[0]})") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"cannot profile {device!r}: give cpu, cuda or cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return dev


def device_identity(device: torch.device) -> tuple[str, dict[str, Any]]:
    """The profile's device name (``cpu``, ``h200``, …) and identity of ``device``."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        short = next((v for k, v in GPU_NAMES.items() if k in name.upper()), name.lower().replace(" ", "-"))
        major, minor = torch.cuda.get_device_capability(device)
        return short, {"gpu": name, "capability": f"{major}.{minor}", "torch": torch.__version__,
                       "cuda": torch.version.cuda}
    return "cpu", {**host_identity(), "threads": torch.get_num_threads()}


def as_trained(compressor: compressors.Compressor) -> compressors.Compressor | compressors.ErrorFeedback:
    """``compressor`` with the memory training gives it by default: error feedback around it, or
    nothing for ``none``, fp16 and bf16 (:func:`compressors.rules.trains_with_error_feedback`)."""
    return compressors.ErrorFeedback(compressor) if trains_with_error_feedback(compressor.name) else compressor


def rotation(numel: int, dev: torch.device) -> int:
    """How many gradients (and output buffers) a row rotates through: three, and on a CPU enough
    that they fill twice its last-level cache, so that each call finds its gradient and its
    output buffer evicted, as a training step does (a backward pass comes between two calls for
    one bucket), at every size."""
    if dev.type != "cpu":
        return 3
    return max(3, math.ceil(2 * host_cache_bytes() / (4 * numel)))


def check_sizes(sizes: Sequence[int], dev: torch.device) -> None:
    """Raise ValueError (one line) before anything is allocated when a size cannot fit on ``dev``:
    its rotation of gradients and output buffers (:func:`rotation`) plus three work copies, fp32."""
    from machine.device import available_memory

    free = available_memory(dev)
    for numel in sorted(set(sizes), reverse=True):
        need = 4 * numel * (2 * rotation(numel, dev) + 3)
        if need > free:
            raise ValueError(f"size {numel:,} elements needs ~{need / 2**30:,.1f} GiB (its gradients, output "
                             f"buffers and 3 work copies), {dev} has {free / 2**30:,.1f} GiB free; lower --sizes")


def settle_heap() -> None:
    """Put glibc's allocator where a training process has it after its first iteration: a block
    just under its largest mmap threshold (32 MiB), mapped and freed, raises the threshold to
    that size and the heap's trim threshold to twice it (they start at 128 and 256 KiB in a fresh
    process, where even a 2 MiB buffer takes fresh pages on every call). From then on a fresh
    buffer under 32 MiB is reused from the heap and one of 32 MiB or more is mapped anew each
    time: the rule of the cost model (``alloc_threshold_bytes``)."""
    block = torch.empty((MMAP_THRESHOLD_BYTES - (1 << 16)) // 4)
    del block


def release_heap() -> None:
    """Hand the C heap's free memory back to the kernel (glibc's ``malloc_trim``; nothing where
    there is no glibc), so that every row starts from the same allocator state: a fresh block of
    32 MiB or more then takes fresh pages (and their faults) in every row, instead of in some rows
    only, depending on what the rows before left free at the top of the heap (fp16's 32 MiB
    message at 2²⁴ elements took 21–25 ms or 34–38 ms per call by the order of the rows)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def median_call(seconds: Sequence[float]) -> int:
    """Index of the median of ``seconds`` (the lower middle one for an even count): a call that
    ran, so its loop counts describe the time it took."""
    order = sorted(range(len(seconds)), key=seconds.__getitem__)
    return order[(len(order) - 1) // 2]


def loops_of_call(name: str, density: float, grads: Sequence[torch.Tensor], call: int, out: torch.Tensor
                  ) -> dict[str, Any]:
    """The loop counts (:func:`compressors.work.counting.loop_counts`) of call number ``call`` (0-based,
    warm-up included) of the sequence :func:`measure` times: the same calls, reseeded alike, run
    again untimed, the last one under the op recorder; for SIDCo also the stage count it planned
    (``planned``) and the stages it added within the call (``deepened``)."""
    comp = compressors.create(name, density=density)
    ef = as_trained(comp)
    for i in range(call):
        comp.reseed(i)
        comp.decompress(ef.compress(grads[i % len(grads)]), out=out)
    comp.reseed(call)
    message, ops = counting.record_ops(lambda: ef.compress(grads[call % len(grads)]))
    return {**counting.loop_counts(name, ops, message.stages), **counting.stage_counts(comp)}


def measure(device: str, sizes: Sequence[int], names: Sequence[str], densities: Sequence[float], *,
            warmup: int = 5, repeats: int = 7, sessions: int = 1, progress: Callable[[str], None] | None = None,
            on_row: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Profile rows for every compressor × density × size on ``device`` (``cpu``, ``cuda``…).

    ``none`` runs once per size (density 1). ``on_row`` sees each row as soon as it is measured
    (with ``sessions`` > 1: every size measured that many times one after the other, each row as
    :func:`combine_sessions` makes it, once the last session is done, or the sessions completed
    when measuring stops halfway).
    On a CPU each size runs in a fresh process (:func:`_size_in_child`, with this process's
    thread count and CPUs): the C heap a size finds is then the same whatever sizes ran before
    (in one process fp16's fresh 32 MiB message at 2²⁴ elements took its pages afresh in some
    calls and not in others, 6 ms or 20 ms a call, by what the smaller sizes had left free).
    """
    dev = torch_device(device)
    compressors.check_names(names)
    if warmup < 0 or repeats < 1 or sessions < 1:
        raise ValueError(f"warm-up must be >= 0, repeats and sessions >= 1, got {warmup}, {repeats} and {sessions}")
    plan = [(n, 1.0) for n in names if n == "none"] + [(n, d) for d in densities for n in names if n != "none"]
    done: list[list[dict[str, Any]]] = []

    def one_session(keep: Callable[[dict[str, Any]], None]) -> None:
        for numel in sizes:
            if dev.type == "cpu":
                _size_in_child(device, numel, plan, warmup, repeats, progress, keep)
            else:
                measure_size(device, numel, plan, warmup, repeats, progress, keep)

    if sessions == 1:
        rows: list[dict[str, Any]] = []
        one_session(lambda row: (rows.append(row), on_row and on_row(row)))
        return rows
    try:
        for _ in range(sessions):
            session: list[dict[str, Any]] = []
            one_session(session.append)
            done.append(session)
    finally:
        rows = combine_sessions(done) if done else []
        for row in rows:
            if on_row:
                on_row(row)
    return rows


def combine_sessions(sessions: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per (compressor, density, size) from the same rows of several sessions: the row
    of the session with the median ``compress_s`` (the lower middle one; its loop counts
    describe its time), with ``decompress_s`` the median of the sessions', the fastest and
    slowest calls of all sessions, and ``sessions`` (how many were combined)."""
    groups: dict[tuple[str, float, int], list[dict[str, Any]]] = {}
    for session in sessions:
        for row in session:
            groups.setdefault((row["compressor"], row["density"], row["numel"]), []).append(row)
    combined = []
    for rows in groups.values():
        row = dict(rows[median_call([r["compress_s"] for r in rows])])
        row["decompress_s"] = rows[median_call([r["decompress_s"] for r in rows])]["decompress_s"]
        row["compress_min_s"] = min(r["compress_min_s"] for r in rows)
        row["compress_max_s"] = max(r["compress_max_s"] for r in rows)
        row["decompress_min_s"] = min(r["decompress_min_s"] for r in rows)
        row["sessions"] = len(rows)
        combined.append(row)
    return combined


def measure_size(device: str, numel: int, plan: Sequence[tuple[str, float]], warmup: int, repeats: int,
                 progress: Callable[[str], None] | None, on_row: Callable[[dict[str, Any]], None]) -> None:
    """The rows of one size, in this process: each ``(compressor, density)`` of ``plan`` with the
    memory training gives it, ``warmup`` untimed calls then ``repeats`` timed ones."""
    dev = torch_device(device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else no_sync
    clock = time.perf_counter if dev.type == "cuda" else host_clock()
    if dev.type == "cpu":
        settle_heap()
    count = rotation(numel, dev)
    grads = [gradient_like(numel, seed, dev) for seed in range(count)]
    outs = [torch.zeros_like(grads[0]) for _ in range(count)]  # touched: no first-touch faults in a timed call
    out = outs[0]
    for name, density in plan:
        if progress:
            progress(f"{name} δ={density:g} n={numel}")
        comp_s, decomp_s, messages = [], [], []
        if dev.type == "cpu":
            release_heap()
        comp = compressors.create(name, density=density)
        ef = as_trained(comp)
        for call in range(warmup + repeats):
            grad = grads[call % len(grads)]
            comp.reseed(call)
            compress_s, sparse = timed(lambda: ef.compress(grad), clock, sync)
            decompress_s, _ = timed(lambda: comp.decompress(sparse, out=outs[call % count]), clock, sync)
            if call >= warmup:
                comp_s.append(compress_s)
                decomp_s.append(decompress_s)
                messages.append((sparse.wire_bytes(), sparse.stages))
        typical = median_call(comp_s)
        data_dependent = compressors.card(name).loops is not None  # its card reads loop counts: they go into the row
        loops = loops_of_call(name, density, grads, warmup + typical, out) if data_dependent else {}
        on_row({
            "compressor": name, "density": density, "numel": numel,
            "compress_s": comp_s[typical], "decompress_s": decomp_s[median_call(decomp_s)],
            "compress_min_s": min(comp_s), "compress_max_s": max(comp_s), "decompress_min_s": min(decomp_s),
            "wire_bytes": messages[typical][0], "stages": messages[typical][1],
            # on a GPU the compressors of FUSED run fused only with Triton installed: the row says what ran
            "backend": comp.backend if dev.type != "cpu" and name in FUSED else backend_on(
                "cpu" if dev.type == "cpu" else "gpu", name),
            **loops,
        })


MEASURING_MODULE = "measuring.profiling"
"""The module a measuring child runs (:func:`_size_in_child`)."""

CHILD_LINE = "sidco-profile "
"""Prefix of the child's report lines on its standard output (other output there is ignored)."""


def refuse_beside_others() -> None:
    """Raise ``ChildProcessError`` (one line, naming its PID) when another measuring child of the
    testbed is alive on this machine: numbers measured beside it would be skewed."""
    others = children.running(MEASURING_MODULE)
    if others:
        raise ChildProcessError(f"another measuring process of the testbed is running (PID {others[0]}); "
                                "measuring beside it would skew the numbers: wait for it to end or kill it")


def _size_in_child(device: str, numel: int, plan: Sequence[tuple[str, float]], warmup: int, repeats: int,
                   progress: Callable[[str], None] | None, on_row: Callable[[dict[str, Any]], None]) -> None:
    """:func:`measure_size` in a fresh Python process (:func:`processes.children.module_argv`, this
    process's thread count; the CPUs it may use are inherited), passing its progress and rows on as
    they come, one JSON line each; ChildProcessError (an OSError: the CLI's one-line error) when it
    fails or dies (the rows it sent before are kept)."""
    job = {"device": device, "numel": numel, "plan": list(plan), "warmup": warmup, "repeats": repeats,
           "threads": torch.get_num_threads()}
    errors = tempfile.TemporaryFile(mode="w+")
    child = subprocess.Popen(children.module_argv(MEASURING_MODULE, json.dumps(job)),
                             stdout=subprocess.PIPE, stderr=errors, text=True)
    failure = None
    try:
        for line in child.stdout:
            if not line.startswith(CHILD_LINE):
                continue
            message = json.loads(line[len(CHILD_LINE):])
            if "progress" in message and progress:
                progress(message["progress"])
            elif "row" in message:
                on_row(message["row"])
            elif "error" in message:
                failure = message["error"]
        code = child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    errors.seek(0)
    last = (errors.read().strip().splitlines() or [""])[-1]
    errors.close()
    if failure or code != 0:
        died = f"the measuring process exited with {code}" + (f": {last}" if last else "")
        raise ChildProcessError(f"profiling {numel} elements: {failure or died}")


def _child_main(job_json: str) -> int:
    """The fresh process of :func:`_size_in_child`: one size, reported on stdout as JSON lines."""
    job = json.loads(job_json)

    def send(message: dict[str, Any]) -> None:
        print(CHILD_LINE + json.dumps(message), flush=True)

    try:
        torch.set_num_threads(int(job["threads"]))
        measure_size(job["device"], int(job["numel"]), [tuple(p) for p in job["plan"]], int(job["warmup"]),
                     int(job["repeats"]), lambda text: send({"progress": text}), lambda row: send({"row": row}))
    except Exception as exc:  # reported to the parent, which raises it as one line
        send({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    return 0


def profile(device: str, sizes: Sequence[int], names: Sequence[str], densities: Sequence[float], *,
            warmup: int = 5, repeats: int = 7, sessions: int = 1, host: devices.Device | None = None,
            progress: Callable[[str], None] | None = None,
            on_partial: Callable[[DeviceProfile, BaseException], None] | None = None) -> DeviceProfile:
    """Measure a whole :class:`DeviceProfile` of ``device``; ``host`` (the measured ``cpu``
    device) is kept with a CPU profile so that ``sidco profile --check`` models it with the
    numbers of the same session. If measuring fails halfway, ``on_partial`` receives the
    profile of the rows measured so far (its source says so) before the error propagates."""
    dev = torch_device(device)
    name, identity = device_identity(dev)
    created = time.strftime("%Y-%m-%d", time.gmtime())
    rows: list[dict[str, Any]] = []
    try:
        measure(device, sizes, names, densities, warmup=warmup, repeats=repeats, sessions=sessions,
                progress=progress, on_row=rows.append)
    except BaseException as exc:
        if rows and on_partial is not None:
            on_partial(_profile(name, identity, created, dev, rows, warmup, repeats, sessions, host, partial=True),
                       exc)
        raise
    return _profile(name, identity, created, dev, rows, warmup, repeats, sessions, host)


def _profile(name: str, identity: dict[str, Any], created: str, dev: torch.device, rows: list[dict[str, Any]],
             warmup: int, repeats: int, sessions: int, host: devices.Device | None,
             partial: bool = False) -> DeviceProfile:
    what = identity.get("gpu") or host_key(identity)
    threads = f", {torch.get_num_threads()} CPU threads" if dev.type == "cpu" else ""
    timer = "" if dev.type == "cuda" or torch.get_num_threads() > 1 else " (process CPU time)"
    source = (f"sidco profile on {what}{threads}, torch {torch.__version__}, {created}: error feedback as trained (none for none, fp16, bf16), "
              f"{warmup} warm-up calls, median of {repeats}{timer}"
              + (f", median of {sessions} sessions" if sessions > 1 else "")
              + (" (partial: the run stopped early)" if partial else ""))
    clock = "wall clock" if dev.type == "cuda" or torch.get_num_threads() > 1 else "process CPU time (1 thread)"
    method = {"warmup": warmup, "repeats": repeats, "sessions": sessions, "statistic": "median",
              "error_feedback": AS_TRAINED, "clock": clock,
              "gradients": "seeded gradient-like vectors (70 % Laplace, 30 % Student-t(3)) and output buffers "
                           "in rotation: 3, or on a CPU enough to fill twice its last-level cache"}
    return DeviceProfile(name, source, tuple(rows), created, identity, method,
                         host.to_json() if host is not None else None)


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1]))
