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


class _Iteration:
    """One iteration's SimPy model: the workers' compute streams and the communication
    process are this class's methods, sharing the per-bucket timestamps (seconds) they
    fill in; :meth:`record` returns them once the environment has run."""

    def __init__(self, prep: Prepared) -> None:
        self.prep, self.sc, self.scale = prep, prep.scenario, prep.scale
        self.n_b, self.p = prep.compress_s.shape
        n_b, p = self.n_b, self.p
        self.on_compute = self.sc.compress_on == "compute"
        self.slowdown = self.sc.interference
        self.env = simpy.Environment()
        self.fwd_end = np.empty(p)
        self.bwd_end = np.empty((n_b, p))
        self.ready = np.empty((n_b, p))
        self.pending = [p] * n_b
        self.all_ready = [self.env.event() for _ in range(n_b)]
        self.intervals: list[list[tuple[float, float]]] = [[] for _ in range(p)]
        self.busy = [False] * p
        self.ranks = p + prep.extra_ranks
        self.fabric = Fabric(self.ranks, prep.flat, gpus=self.sc.gpus_per_node, intra=prep.intra, sites=prep.sites,
                             wan=prep.wan)
        self.start = np.empty((n_b, p))
        self.comp_end = np.empty((n_b, p))
        self.joined = np.empty((n_b, p))
        self.xfer_end = np.empty((n_b, p))
        self.dec_end = np.empty((n_b, p))
        self.workers = [self.env.process(self.compute(w)) for w in range(p)]
        self.env.process(self.communicate())

    def run(self, w: int, work: float):
        """Compute ``work`` s; with interference, slower inside this worker's transfers
        (the communication process interrupts when it schedules a new transfer)."""
        env = self.env
        if not self.slowdown:
            yield env.timeout(work)
            return
        begun, left = env.now, work
        while True:
            self.busy[w] = True
            try:
                yield env.timeout(max(0.0, advance_one(env.now, left, self.intervals[w], self.slowdown) - env.now))
                self.busy[w] = False
                return
            except simpy.Interrupt:
                left = max(0.0, left - work_done(begun, env.now, self.intervals[w], self.slowdown))
                begun = env.now

    def compute(self, w: int):
        """Worker ``w``'s compute stream: forward, then backward bucket by bucket (and
        compression when it runs on the compute stream), marking each bucket ready."""
        env, prep, scale = self.env, self.prep, self.scale
        yield env.timeout(self.sc.workload.forward_s * scale[w])
        self.fwd_end[w] = env.now
        for b in range(self.n_b):
            yield from self.run(w, prep.backward_s[b] * scale[w])
            self.bwd_end[b, w] = env.now
            if self.on_compute:
                yield from self.run(w, prep.compress_s[b, w])
            self.ready[b, w] = env.now
            self.pending[b] -= 1
            if not self.pending[b]:
                self.all_ready[b].succeed()

    def communicate(self):
        """The communication process: each bucket's collective on the fabric, in order,
        once every worker has produced it."""
        prep, p = self.prep, self.p
        free = np.zeros(self.ranks)
        for b in range(self.n_b):
            yield self.all_ready[b]
            begin = np.maximum(self.ready[b], free[:p])
            self.comp_end[b] = begin if self.on_compute else begin + prep.compress_s[b]
            entry = free.copy()
            entry[:p] = self.comp_end[b]
            for phase in prep.phases[b]:
                if phase.gap_s:
                    entry[:p] = entry[:p] + phase.gap_s
                entry = self.fabric.run(phase.plan, phase.nbytes, entry, phase.sizes, link=phase.link)
            self.start[b] = begin
            self.xfer_end[b] = entry[:p]
            self.joined[b] = np.minimum(self.comp_end[b].max(), self.xfer_end[b])
            self.dec_end[b] = entry[:p] + prep.decompress_s[b]
            free = entry
            free[:p] = self.dec_end[b]
            if self.slowdown:
                for w in range(p):
                    self.intervals[w].append((float(self.joined[b, w]), float(self.xfer_end[b, w])))
                    if self.busy[w]:
                        self.workers[w].interrupt()

    def record(self) -> Record:
        """The timestamps (seconds) as a :class:`Record`, after the environment has run."""
        return Record(self.fwd_end, self.bwd_end, self.ready, self.start, self.comp_end,
                      self.joined, self.xfer_end, self.dec_end)


def run_des(prep: Prepared) -> Record:
    """Simulate one iteration of ``prep`` event by event; returns the same :class:`Record`
    as :func:`simulator.iteration.run_analytic`."""
    model = _Iteration(prep)
    model.env.run()
    return model.record()
