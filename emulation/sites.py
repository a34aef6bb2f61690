"""Two sites over a delayed link: the namespace plan, the WAN's shaping and delay, and the runs across it.

Topology for ``sites`` = 2 sites of ``per_site`` ranks each (nothing in the host's namespace):

- one namespace ``<prefix>-s<k>`` per site holding a bridge ``br0``; the site's ranks are
  joined to it as in :func:`emulation.plan.make_plan` (namespace ``<prefix>-w<i>``, rank ``i``
  on site ``i // per_site``, its veth shaped by tbf to the site's link rate, or unshaped);
- the WAN between the two site bridges, ``wan0`` a port of site 0's and ``wan1`` of site 1's: a
  veth pair (netem, or no delay) or two TAP devices joined by the delay line. Every address sits
  in one ``10.a.b.0/24``, so a site reaches the other over the WAN alone;
- every rank's namespace keeps TCP's window across idle gaps (:data:`NO_SLOW_START_AFTER_IDLE`).

How the WAN is delayed (:func:`wan_delay` picks; the run records which, ``wan_delay``):

- :data:`NETEM`, where the kernel has ``sch_netem``: each end's egress (one direction each)
  holds one ``netem`` qdisc with ``delay`` rtt/2 and ``rate`` B. netem computes each packet's
  departure from both at once: the later of its arrival plus the delay and the previous packet's
  departure, plus its own serialisation at ``rate`` (``netem_enqueue``), so a stream leaves at B,
  each packet at least the delay after it came, and the delay is not paid again per packet. Two
  qdiscs (a netem delay with a tbf child, or the reverse) need two queues sized together and a
  tbf bucket that lets bursts through; one qdisc has one queue and no bucket. Its queue
  ``limit`` (packets) holds the bandwidth-delay product plus :data:`emulation.plan.QUEUE_MIN_BYTES`
  (netem's default of 1,000 packets drops at high rate × delay).
- :data:`DELAY_LINE`, where it has not but has TUN/TAP: ``wan0`` and ``wan1`` are TAP devices
  and :mod:`emulation.delayline`, a child of the run, writes every frame one end gives it into
  the other rtt/2 after (first in first out). Each TAP's egress (towards the line) holds a tbf at
  B (:func:`emulation.plan.tbf`): frames are serialised at B before the delay, as in netem. The
  line itself holds the frames in flight (B × rtt/2, unbounded), so the tbf's queue is the queue
  above the bandwidth-delay product, as netem's beyond it: :data:`emulation.plan.QUEUE_MIN_BYTES`
  or 100 ms at B; the TAP's own ring (``txqueuelen``) holds as many full frames, so a late line
  does not drop. No jitter and no loss; rates up to :data:`emulation.delayline.MAX_BPS`.
- :data:`NO_DELAY` with ``rtt`` 0: the WAN is a tbf at B (:func:`emulation.plan.tbf`) on a veth.

:func:`run_sites` runs the real workers in that network: DiLoCo (:mod:`emulation.sites_worker`)
and per-step DDP with a compressor's hook (:mod:`emulation.worker`, recording its compute trace as
the single-site emulation does) across every rank. With one rank per site they are held to
:func:`diloco_closed_form` and :func:`project_per_step` (the single-site DDP projection with the
WAN as the two ranks' only link, at :func:`wan_level`).
"""

from __future__ import annotations

import os
import secrets
import statistics
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from costs import CompressionProfile
from emulation import delayline
from emulation.launch import run_workers
from emulation.network import COMMAND_TIMEOUT_S, Network, require_emulation
from emulation.plan import (FRAME_BYTES, IFNAME, MTU_BYTES, PREFIX_ROOT, QUEUE_MIN_BYTES, NetworkPlan, bridge,
                            check_shaping, tbf, tbf_parameters, unique_prefix, worker_link)
from emulation.projection import network_share, project
from emulation.training import run_compressors
from simulator.calibration import Calibration
from simulator.links import Level
from simulator.topologies import ring_seconds

SITES = 2
"""Sites the emulation joins (one WAN link between two bridges; more would need a WAN switch)."""
WAN_RTT_MAX_S = 10.0
"""Longest round trip the emulated WAN takes (s): netem's delay is fine to seconds, TCP's timers are not."""
NO_SLOW_START_AFTER_IDLE = "net.ipv4.tcp_slow_start_after_idle"
"""The sysctl (per namespace) set to 0 in every rank's namespace: TCP keeps its window over the
idle H inner steps between outer exchanges, as hosts tuned for WAN transfers do; at 1 "after an idle
RTO" each exchange would climb out of slow start again (≈ log2(BDP/10 segments) extra round trips)."""
NETEM_MIN_LIMIT_PACKETS = 1000
"""netem's own default queue limit (packets), the least :func:`netem_command` sets."""
NETEM = "netem"
"""The WAN delayed by one netem qdisc per direction (the module docstring)."""
DELAY_LINE = "userspace delay line"
"""The WAN delayed by :mod:`emulation.delayline` between two TAP devices (the module docstring)."""
NO_DELAY = "none"
"""The WAN of round trip 0: a tbf alone."""
GLOO_CROSSINGS_PER_STEP = 2
"""WAN crossings each dependent step of gloo's ring all-reduce waits for. gloo's TCP transport sends
a buffer only once the receiver's recv-ready notification has come (``Pair::send`` holds it until
``NOTIFY_RECV_READY``), and a ring step posts its receives when it begins, so every step pays the
notification's crossing and then the data's: a round trip, where a link level of
:mod:`simulator.topologies` charges one way (a transport whose receives are posted ahead). Measured
over the delay line at 50 Mbit/s, the 1.09 MB all-reduce on two ranks (two dependent steps) took
285.0 ms at a 50 ms round trip and 386.4 ms at 100 ms: 2.03 round trips more for 1 more."""
WAN_ENDS = ("wan0", "wan1")
"""The WAN's device in site 0's namespace and in site 1's."""


def check_wan(sites: int, per_site: int, wan_bandwidth_bps: float, wan_rtt_s: float) -> None:
    """ValueError (one line) unless the request is one :func:`make_sites_plan` builds: exactly
    :data:`SITES` sites of ≥ 1 rank, a WAN rate tc shapes (bits/s), a round trip 0 … :data:`WAN_RTT_MAX_S` s."""
    if sites != SITES:
        raise ValueError(f"--sites {sites}: the emulation joins exactly {SITES} sites over one WAN link")
    if per_site < 1:
        raise ValueError(f"each site needs at least one rank, got {per_site}")
    check_shaping(wan_bandwidth_bps)
    if not 0.0 <= wan_rtt_s <= WAN_RTT_MAX_S:
        raise ValueError(f"--wan-rtt {wan_rtt_s:g} s: give 0 to {WAN_RTT_MAX_S:g} s")


def netem_limit_packets(bandwidth_bps: float, delay_s: float) -> int:
    """netem's queue limit (packets) for a link of ``bandwidth_bps`` (bits/s) and one-way ``delay_s``
    (s): the packets in flight over the delay plus :data:`QUEUE_MIN_BYTES` of queue, in full frames,
    at least :data:`NETEM_MIN_LIMIT_PACKETS`."""
    in_flight = bandwidth_bps / 8.0 * delay_s + QUEUE_MIN_BYTES
    return max(NETEM_MIN_LIMIT_PACKETS, -(-int(in_flight) // MTU_BYTES))


def netem_command(namespace: str, device: str, bandwidth_bps: float, delay_s: float) -> tuple[str, ...]:
    """The command that delays ``device``'s egress in ``namespace`` by ``delay_s`` (s) at ``bandwidth_bps``
    (bits/s) in one netem qdisc (the module docstring)."""
    check_shaping(bandwidth_bps)
    return ("tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "netem",
            "delay", f"{round(delay_s * 1e6)}us", "rate", f"{int(bandwidth_bps)}bit",
            "limit", str(netem_limit_packets(bandwidth_bps, delay_s)))


def tap_queue_frames(bandwidth_bps: float) -> int:
    """The TAP's ring (``txqueuelen``, frames) between its tbf at ``bandwidth_bps`` (bits/s) and the
    delay line: the tbf's queue limit in full frames, so a line late by that much drops nothing."""
    return -(-tbf_parameters(bandwidth_bps)[1] // FRAME_BYTES)


def site_of(rank: int, per_site: int) -> int:
    """The site of ``rank`` (ranks ``k·per_site … (k+1)·per_site − 1`` are site ``k``)."""
    return rank // per_site


def make_sites_plan(per_site: int, site_bandwidth_bps: float | None, wan_bandwidth_bps: float, wan_rtt_s: float,
                    *, delay: str = NETEM, prefix: str | None = None,
                    subnet: tuple[int, int] | None = None) -> NetworkPlan:
    """Plan :data:`SITES` sites of ``per_site`` ranks, each rank's link at ``site_bandwidth_bps``
    (bits/s; ``None``: unshaped), the sites joined by a WAN of ``wan_bandwidth_bps`` (bits/s) and
    round trip ``wan_rtt_s`` (s), delayed by ``delay`` (:data:`NETEM` or :data:`DELAY_LINE`, whose
    relay is the plan's child; at round trip 0 none is, whichever is named) (the module docstring).
    ``bridge_ns`` is site 0's bridge; the teardown removes every namespace, the TAP devices with
    them. ValueError (one line) on a request :func:`check_wan` refuses, or the delay line at a rate
    it does not hold."""
    check_wan(SITES, per_site, wan_bandwidth_bps, wan_rtt_s)
    if delay not in (NETEM, DELAY_LINE, NO_DELAY):
        raise ValueError(f"unknown WAN delay {delay!r}: choose {NETEM!r} or {DELAY_LINE!r}")
    line = wan_rtt_s > 0 and delay == DELAY_LINE
    if line:
        delayline.check_rate(wan_bandwidth_bps)
    if site_bandwidth_bps is not None:
        check_shaping(site_bandwidth_bps)
    workers = SITES * per_site
    if workers > 250:
        raise ValueError(f"at most 250 ranks fit one /24, got {workers}")
    prefix = prefix or unique_prefix()
    if not prefix.startswith(PREFIX_ROOT) or any(ch.isspace() or ch == "/" for ch in prefix):
        raise ValueError(f"namespace prefix {prefix!r} must start with {PREFIX_ROOT!r} and hold no spaces or '/'")
    a, b = subnet or (100 + secrets.randbelow(100), secrets.randbelow(250))
    site_ns = tuple(f"{prefix}-s{k}" for k in range(SITES))
    worker_ns = tuple(f"{prefix}-w{i}" for i in range(workers))
    addresses = tuple(f"10.{a}.{b}.{i + 1}" for i in range(workers))

    setup: list[tuple[str, ...]] = [("ip", "netns", "add", ns) for ns in (*site_ns, *worker_ns)]
    for ns in site_ns:
        setup += bridge(ns)
    for i, (ns, addr) in enumerate(zip(worker_ns, addresses)):
        setup += worker_link(site_ns[site_of(i, per_site)], f"vp{i}", ns, addr, site_bandwidth_bps)
        setup.append(("ip", "netns", "exec", ns, "sysctl", "-q", "-w", f"{NO_SLOW_START_AFTER_IDLE}=0"))
    if line:
        setup += [step for ns, end in zip(site_ns, WAN_ENDS) for step in (
            ("ip", "-n", ns, "tuntap", "add", "dev", end, "mode", "tap"),
            ("ip", "-n", ns, "link", "set", end, "txqueuelen", str(tap_queue_frames(wan_bandwidth_bps))))]
    else:
        setup.append(("ip", "-n", site_ns[0], "link", "add", WAN_ENDS[0], "type", "veth",
                      "peer", "name", WAN_ENDS[1], "netns", site_ns[1]))
    for ns, end in zip(site_ns, WAN_ENDS):
        setup += [("ip", "-n", ns, "link", "set", end, "master", "br0"), ("ip", "-n", ns, "link", "set", end, "up")]
        setup.append(netem_command(ns, end, wan_bandwidth_bps, wan_rtt_s / 2.0) if wan_rtt_s > 0 and not line
                     else tbf(ns, end, wan_bandwidth_bps))
    children = (("emulation.delayline", "--delay", repr(wan_rtt_s / 2.0),
                 *(arg for ns, end in zip(site_ns, WAN_ENDS) for arg in ("--end", ns, end))),) if line else ()
    teardown = tuple(("ip", "netns", "del", ns) for ns in (*worker_ns, *site_ns))
    return NetworkPlan(prefix=prefix, workers=workers, bandwidth_bps=site_bandwidth_bps, bridge_ns=site_ns[0],
                       worker_ns=worker_ns, addresses=addresses, ifname=IFNAME, setup=tuple(setup),
                       teardown=teardown, children=children)


def netem_missing() -> str | None:
    """A one-line reason why this kernel cannot delay a link by netem (no ``sch_netem``), or ``None``
    when it can. Tries a netem qdisc on a veth in a namespace of its own, removed after."""
    require_emulation()
    ns = f"{unique_prefix()}-probe"
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True, timeout=COMMAND_TIMEOUT_S)
        subprocess.run(["ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1"], check=True,
                       capture_output=True, timeout=COMMAND_TIMEOUT_S)
        result = subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", "p0", "root", "netem", "delay", "1ms"],
                                capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=COMMAND_TIMEOUT_S)
    if result.returncode == 0:
        return None
    detail = (result.stderr or result.stdout).strip().splitlines()
    return f"this kernel cannot delay a link with tc netem ({detail[0] if detail else result.returncode})"


def tap_missing() -> str | None:
    """A one-line reason why the delay line cannot run here (no TUN/TAP), or ``None`` when it can.
    Attaches a TAP device (:func:`emulation.delayline.attach`) in a namespace of its own, removed after."""
    require_emulation()
    ns = f"{unique_prefix()}-probe"
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True, timeout=COMMAND_TIMEOUT_S)
        os.close(delayline.attach(ns, "probe0"))
    except OSError as error:
        return f"no TAP device for the userspace delay line ({error})"
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=COMMAND_TIMEOUT_S)
    return None


def wan_delay(wan_bandwidth_bps: float, wan_rtt_s: float) -> str:
    """How this machine delays a WAN of ``wan_bandwidth_bps`` (bits/s) and round trip ``wan_rtt_s`` (s):
    :data:`NO_DELAY` at round trip 0, :data:`NETEM` where the kernel has it, else :data:`DELAY_LINE`.
    ValueError (one line) when neither can, or the delay line does not hold the rate."""
    if wan_rtt_s == 0:
        return NO_DELAY
    netem = netem_missing()
    if netem is None:
        return NETEM
    tap = tap_missing()
    if tap:
        raise ValueError(f"{netem}, and {tap}; use --wan-rtt 0")
    delayline.check_rate(wan_bandwidth_bps, f"{netem}: ")
    return DELAY_LINE


def wan_level(wan_bandwidth_bps: float, wan_rtt_s: float, calibration: Calibration | None = None,
              sites: int = SITES) -> Level:
    """The WAN as gloo's all-reduce meets it, as the simulator's link level: bytes/s per direction,
    latency per dependent step :data:`GLOO_CROSSINGS_PER_STEP` one-way crossings (rtt, s); with
    ``calibration``, its all-reduce fit on ``sites`` ranks (α added to the latency, the rate times
    its efficiency)."""
    bps, latency_s = wan_bandwidth_bps, GLOO_CROSSINGS_PER_STEP * wan_rtt_s / 2.0
    if calibration is not None:
        bps = calibration.bandwidth(bps, "allreduce", sites)
        latency_s = calibration.latency(latency_s, "allreduce", sites)
    return Level(bandwidth_Bps=bps / 8.0, latency_s=latency_s)


def diloco_closed_form(inner_s: float, outer_local_s: float, model_bytes: int, sync_every: int,
                       wan_bandwidth_bps: float, wan_rtt_s: float, sites: int = SITES,
                       calibration: Calibration | None = None) -> dict[str, float]:
    """The projected DiLoCo inner step across ``sites`` sites of one rank each (seconds):

    ``t = inner_s + (outer_local_s + T_wan) / H`` with ``T_wan`` the ring all-reduce of the
    ``model_bytes``-byte pseudo-gradient over the WAN (:func:`simulator.topologies.ring_seconds`:
    ``2(S−1)`` dependent steps of a round trip each, gloo's (:data:`GLOO_CROSSINGS_PER_STEP`), plus
    ``2(S−1)/S · n / B``). ``inner_s``: the
    measured inner step of the slowest site (compute; inside a site of one rank nothing is sent);
    ``outer_local_s``: the measured outer step without its exchange (pseudo-gradient, outer
    optimizer, reset) — :func:`summarize_diloco`'s.
    With ``calibration`` the WAN is :func:`wan_level`'s calibrated one. Equal to
    ``simulator.topologies.Sites``' all-reduce at one node per site on a WAN of round trip 2·rtt
    (its latency is rtt/2 a step: one way), amortised as ``simulator.lowcomm.amortised_s`` does for
    blocking DiLoCo (branch i46-sites).
    Returns ``iteration_s``, ``wan_s`` (``T_wan``) and ``wan_share`` (``T_wan/H ÷ iteration_s``)."""
    wan_s = ring_seconds("allreduce", float(model_bytes), sites,
                         wan_level(wan_bandwidth_bps, wan_rtt_s, calibration, sites))
    iteration_s = inner_s + (outer_local_s + wan_s) / sync_every
    return {"iteration_s": iteration_s, "wan_s": wan_s, "wan_share": wan_s / sync_every / iteration_s}


def project_per_step(trace_path: str, compressor: str, density: float, wan_bandwidth_bps: float, wan_rtt_s: float,
                     *, profile: CompressionProfile | None = None, calibration: Calibration | None = None,
                     rank_passes: Sequence[Sequence[Mapping[str, float]]] | None = None) -> dict[str, Any]:
    """The projected per-step DDP iteration with ``compressor`` at ``density`` across :data:`SITES`
    sites of one rank each: :func:`emulation.projection.project` of the run's own trace
    (``trace_path``; its compute model from every rank's compute-only passes, ``rank_passes``, and
    ``profile``'s compression costs, as the single-site emulation projects a DDP run) on a ring of
    the two ranks whose only link is the WAN, at ``wan_bandwidth_bps`` (bits/s) with the latency of
    :func:`wan_level` per dependent step (a round trip: :data:`GLOO_CROSSINGS_PER_STEP`), nominal or
    with ``calibration`` (each operation's fit on two ranks: α added to each step, the rate times its
    efficiency, as the DiLoCo row's all-reduce). The steps the real hook waits for, each a round trip
    over gloo, are the ring's:

    - ``none``: one all-reduce of each bucket, two dependent steps (reduce-scatter, all-gather);
    - a sparsifier (:class:`compressors.ddp.exchange.PaddedAllGather`): the all-gather of the counts,
      waited for on the host (one step: gloo's two-rank all-gather posts both halves at once), then
      the all-gather of the padded selections (one step), the simulator's padded exchange;
    - DDP's broadcast of rank 0's buffers at the start of every forward crosses the WAN too; the
      compute-only passes run it (:mod:`emulation.worker`), so it is in the compute model.

    Nominal, it equals the sites model (:class:`simulator.topologies.Sites`) at one node per site on
    a WAN of round trip 2·rtt. Returns ``project``'s result (seconds) with ``wan_share``: the projected
    transfer time's share of the iteration (:func:`emulation.projection.network_share`)."""
    got = project(trace_path, SITES, wan_bandwidth_bps, [compressor], density, profile=profile,
                  calibration=calibration, rank_passes=rank_passes,
                  latency_s=wan_level(wan_bandwidth_bps, wan_rtt_s).latency_s)[compressor]
    return {**got, "wan_share": network_share(got)}


def summarize_diloco(per_rank: Sequence[dict[str, Any]], sync_every: int) -> dict[str, float]:
    """The DiLoCo workers' timed rounds as medians over the rounds (seconds). A round ends for every
    rank when its cross-site all-reduce does, so it is paced by the slowest site: per round,
    ``inner_s`` is the slowest rank's inner steps ÷ H, ``outer_local_s`` the slowest rank's outer
    step without its exchange, and ``exchange_s`` the all-reduce as the last rank to reach it saw it
    (the least over the ranks: the others' include their wait for it). ``measured_s`` is the wall
    time per inner step, a round (its inner steps and outer step, median over the ranks) ÷ H."""
    rounds = list(zip(*(rank["rounds"] for rank in per_rank)))

    def median(of: Any) -> float:
        return statistics.median(of(ranks) for ranks in rounds)

    return {
        "measured_s": median(lambda ranks: statistics.median(r["round_s"] for r in ranks) / sync_every),
        "inner_s": median(lambda ranks: max(sum(r["inner_s"]) for r in ranks) / sync_every),
        "exchange_s": median(lambda ranks: min(r["exchange_s"] for r in ranks)),
        "outer_local_s": median(lambda ranks: max(r["outer_s"] - r["exchange_s"] for r in ranks)),
    }


def run_sites(per_site: int, site_bandwidth_bps: float | None, wan_bandwidth_bps: float, wan_rtt_s: float,
              workload: str, *, sync_every: int, rounds: int, warmup_rounds: int, batch_size: int,
              compressors: Sequence[str] = (), density: float = 0.01, iterations: int = 0, warmup: int = 0,
              trace_dir: str | Path | None = None, seed: int = 0, timeout_s: float = 600.0,
              delay: str | None = None) -> dict[str, Any]:
    """Build the two-site network and run in it, with fresh processes each: DiLoCo
    (``rounds`` timed rounds of ``sync_every`` inner steps after ``warmup_rounds``), then per-step
    DDP with each of ``compressors`` at ``density`` across every rank (``iterations`` timed after
    ``warmup``, each followed by a compute-only pass; rank 0 records the trace into
    ``trace_dir/<compressor>``, needed with ``compressors``); the WAN delayed by ``delay`` (default:
    :func:`wan_delay`'s choice). Returns ``diloco`` (:func:`summarize_diloco`, with ``model_bytes``),
    ``per_step`` (one dict per compressor, :func:`emulation.training.run_compressors`': ``compressor``,
    ``trace``, ``measured_s`` the mean iteration (s), ``compute_passes``, ...) and ``wan_delay`` (how
    the WAN was delayed: :data:`NETEM`, :data:`DELAY_LINE` or :data:`NO_DELAY`)."""
    if compressors and trace_dir is None:
        raise ValueError("per-step runs record their compute trace: give trace_dir")
    require_emulation()
    if wan_rtt_s == 0:
        delay = NO_DELAY
    elif delay is None:
        delay = wan_delay(wan_bandwidth_bps, wan_rtt_s)
    base = ["--workload", workload, "--batch-size", str(batch_size), "--seed", str(seed)]
    diloco_args = [*base, "--sites", str(SITES), "--sync-every", str(sync_every), "--rounds", str(rounds),
                   "--warmup-rounds", str(warmup_rounds)]
    workers = SITES * per_site
    plan = make_sites_plan(per_site, site_bandwidth_bps, wan_bandwidth_bps, wan_rtt_s, delay=delay)
    with Network(plan):
        per_rank = run_workers("emulation.sites_worker", diloco_args, workers, plan, timeout_s)
        per_step = [] if trace_dir is None else run_compressors(
            plan, workers, workload, compressors, density, iterations=iterations, warmup=warmup,
            batch_size=batch_size, trace_dir=Path(trace_dir), seed=seed, timeout_s=timeout_s)
    diloco = {**summarize_diloco(per_rank, sync_every), "model_bytes": int(per_rank[0]["model_bytes"])}
    return {"diloco": diloco, "per_step": per_step, "wan_delay": delay}
