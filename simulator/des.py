"""The ``des`` fidelity: SimPy compute streams plus link-level collectives.

Every worker is a SimPy process walking its compute stream (forward, then backward
bucket by bucket, compression when it runs on the compute stream) with its own
speed (jitter, stragglers). A communication process takes the buckets in order; a
bucket's collective runs on the :class:`~simulator.links.Fabric` as link-level
messages, each rank entering when *it* is ready (its bucket produced, its previous
collective and decompression done), so a straggler delays exactly the messages that
depend on it, and links keep their busy-until state across buckets. A worker's transfer
is counted from the moment the last rank joined the collective (earlier waiting is
idle time, even though early ranks already send their first chunks). With
interference, a worker's compute runs slower inside its transfers: the communication
process interrupts a computing worker when it schedules a transfer, and the worker
recomputes when its current piece of work ends.
"""

from __future__ import annotations

import numpy as np
import simpy

from simulator.interference import advance_one, work_done
from simulator.iteration import Prepared, Record
from simulator.links import Fabric


def run_des(prep: Prepared) -> Record:
    """Simulate one iteration of ``prep`` event by event; returns the same :class:`Record`
    as :func:`simulator.iteration.run_analytic`."""
    sc, scale = prep.scenario, prep.scale
    n_b, p = prep.compress_s.shape
    on_compute = sc.compress_on == "compute"
    env = simpy.Environment()
    fwd_end = np.empty(p)
    bwd_end = np.empty((n_b, p))
    ready = np.empty((n_b, p))
    pending = [p] * n_b
    all_ready = [env.event() for _ in range(n_b)]
    slowdown = sc.interference
    intervals: list[list[tuple[float, float]]] = [[] for _ in range(p)]
    busy = [False] * p

    def run(w: int, work: float):
        """Compute ``work`` s; with interference, slower inside this worker's transfers
        (the communication process interrupts when it schedules a new transfer)."""
        if not slowdown:
            yield env.timeout(work)
            return
        begun, left = env.now, work
        while True:
            busy[w] = True
            try:
                yield env.timeout(max(0.0, advance_one(env.now, left, intervals[w], slowdown) - env.now))
                busy[w] = False
                return
            except simpy.Interrupt:
                left = max(0.0, left - work_done(begun, env.now, intervals[w], slowdown))
                begun = env.now

    def compute(w: int):
        yield env.timeout(sc.workload.forward_s * scale[w])
        fwd_end[w] = env.now
        for b in range(n_b):
            yield from run(w, prep.backward_s[b] * scale[w])
            bwd_end[b, w] = env.now
            if on_compute:
                yield from run(w, prep.compress_s[b, w])
            ready[b, w] = env.now
            pending[b] -= 1
            if not pending[b]:
                all_ready[b].succeed()

    ranks = p + prep.extra_ranks
    fabric = Fabric(ranks, prep.flat, gpus=sc.gpus_per_node, intra=prep.intra)
    start = np.empty((n_b, p))
    comp_end = np.empty((n_b, p))
    joined = np.empty((n_b, p))
    xfer_end = np.empty((n_b, p))
    dec_end = np.empty((n_b, p))

    def communicate():
        free = np.zeros(ranks)
        for b in range(n_b):
            yield all_ready[b]
            begin = np.maximum(ready[b], free[:p])
            comp_end[b] = begin if on_compute else begin + prep.compress_s[b]
            entry = free.copy()
            entry[:p] = comp_end[b]
            for phase in prep.phases[b]:
                if phase.gap_s:
                    entry[:p] = entry[:p] + phase.gap_s
                entry = fabric.run(phase.plan, phase.nbytes, entry, phase.sizes, link=phase.link)
            start[b] = begin
            xfer_end[b] = entry[:p]
            joined[b] = np.minimum(comp_end[b].max(), xfer_end[b])
            dec_end[b] = entry[:p] + prep.decompress_s[b]
            free = entry
            free[:p] = dec_end[b]
            if slowdown:
                for w in range(p):
                    intervals[w].append((float(joined[b, w]), float(xfer_end[b, w])))
                    if busy[w]:
                        workers[w].interrupt()

    workers = [env.process(compute(w)) for w in range(p)]
    env.process(communicate())
    env.run()
    return Record(fwd_end, bwd_end, ready, start, comp_end, joined, xfer_end, dec_end)
