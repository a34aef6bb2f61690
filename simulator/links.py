"""The link-level engine: directed links as FIFO servers with "busy-until" arithmetic.

Every rank has one egress and one ingress link per level (full-duplex NIC, or the
intra-node link of a GPU); a non-blocking switch joins them. A message from ``a`` to
``b`` of ``x`` bytes starts when the sender may send (its gate), ``a``'s egress and
``b``'s ingress are all free; it holds both for ``x/B`` seconds (cut-through) and is
delivered ``α`` seconds after its last byte leaves. Messages enter links in protocol
order. No process per message: a step of a :class:`~simulator.plans.Plan` is one
vector operation over its messages (a SimPy process per message would be several times
slower; docs/model.md, "Fidelities").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.plans import Plan


@dataclass(frozen=True)
class Level:
    """One level of links: ``bandwidth_Bps`` in bytes/s per link and direction, ``latency_s`` in s."""

    bandwidth_Bps: float
    latency_s: float


class Fabric:
    """Busy-until times (s) of every link of a cluster of ``ranks`` ranks.

    ``gpus`` > 1 adds a second level: ranks ``node·gpus + gpu`` on ``intra`` links,
    one NIC per node on ``inter`` links. With ``gpus == 1`` the ``flat`` level is used.
    ``sites`` > 1 splits the ranks evenly into that many sites (consecutive blocks) joined by
    ``wan`` links: ``wan`` steps address sites, one aggregated flow per site and direction,
    gated by the site's last rank and delivered to every rank of the destination site.
    """

    def __init__(self, ranks: int, flat: Level, *, gpus: int = 1, intra: Level | None = None,
                 sites: int = 1, wan: Level | None = None) -> None:
        self.ranks = ranks
        self.gpus = gpus
        self.levels = {"flat": flat, "inter": flat, "intra": intra or flat, "wan": wan or flat}
        nodes = ranks // gpus
        self.group = {"inter": gpus, "wan": ranks // sites}
        self.egress = {"flat": np.zeros(ranks), "intra": np.zeros(ranks), "inter": np.zeros(nodes),
                       "wan": np.zeros(sites)}
        self.ingress = {"flat": np.zeros(ranks), "intra": np.zeros(ranks), "inter": np.zeros(nodes),
                        "wan": np.zeros(sites)}

    def run(
        self, plan: Plan, nbytes: float, entry: np.ndarray, sizes: np.ndarray | None = None,
        *, link: Level | None = None,
    ) -> np.ndarray:
        """Run ``plan`` for a buffer of ``nbytes`` bytes; ranks enter at ``entry`` (s).

        ``link``: the flat/inter level's bandwidth and latency as this collective sees them
        (e.g. its own calibration), in place of the fabric's (the intra-node and WAN levels keep
        theirs); busy-until state is shared.

        ``sizes`` are the per-rank (per-node for inter-level all-gathers) contributions in
        bytes of all-gather steps. Returns, per rank, when it has sent and received
        everything (s).
        """
        override = link
        gate = np.array(entry, dtype=float)
        recv = gate.copy()
        done = gate.copy()
        m = np.zeros(1) if sizes is None else np.asarray(sizes, dtype=float)
        for step in plan:
            level = step.level
            link = self.levels[level] if override is None or level in ("intra", "wan") else override
            egress, ingress = self.egress[level], self.ingress[level]
            node_level = level in self.group
            g = self.group.get(level, 1)
            src, dst = step.src, step.dst
            whole = step.identity and len(src) == len(egress)
            if step.wait:
                if node_level:
                    node_gate = np.maximum(gate, recv).reshape(-1, g).max(axis=1)
                    gate.reshape(-1, g)[src] = node_gate[src, None]
                elif whole:
                    np.maximum(gate, recv, out=gate)
                else:
                    gate[src] = np.maximum(gate[src], recv[src])
            if node_level:
                src_gate = gate.reshape(-1, g).max(axis=1)[src]
            else:
                src_gate = gate if whole else gate[src]
            if step.uniform is not None:
                dur = step.uniform * nbytes / link.bandwidth_Bps
            else:
                dur = (step.coef * nbytes + step.mcoef * m[step.owner]) / link.bandwidth_Bps
            if step.serial:
                dur = np.broadcast_to(dur, src.shape)
                end = np.empty(len(src))
                for i, (a, b) in enumerate(zip(src, dst)):
                    start = max(src_gate[i], egress[a], ingress[b])
                    end[i] = egress[a] = ingress[b] = start + dur[i]
            else:
                start = np.maximum(src_gate, egress if whole else egress[src])
                np.maximum(start, ingress[dst], out=start)
                end = start + dur
                if whole:
                    egress[:] = end
                else:
                    egress[src] = end
                ingress[dst] = end
            arrive = end + link.latency_s
            if node_level:
                arrive, end = arrive[:, None], end[:, None]
                rv, dn = recv.reshape(-1, g), done.reshape(-1, g)
            else:
                rv, dn = recv, done
            if step.serial:
                np.maximum.at(rv, dst, arrive)
                np.maximum.at(dn, src, end)
            else:
                rv[dst] = np.maximum(rv[dst], arrive)
                if whole and not node_level:
                    np.maximum(dn, end, out=dn)
                else:
                    dn[src] = np.maximum(dn[src], end)
        return np.maximum(recv, done)
