"""The namespace and shaping plan: a pure function from a request to the ``ip``/``tc`` commands.

Topology for ``p`` workers (nothing is created in the host's network namespace):

- one namespace ``<prefix>-br`` holding a Linux bridge ``br0``;
- one namespace ``<prefix>-w<i>`` per worker, each with a veth end of the same name
  (:data:`IFNAME`) carrying a private address ``10.<a>.<b>.<i+1>/24``;
- the other veth end ``vp<i>`` sits in the bridge namespace as a bridge port.

Shaping (when a bandwidth is given): a ``tbf`` qdisc at the requested rate on the worker's
veth end (its uplink) and on the bridge-side end (its downlink), so every worker sends and
receives at most ``bandwidth_bps``. No delay is added (the WAN across sites is delayed:
:mod:`emulation.sites`).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass

IFNAME = "sidco0"
BRIDGE = "br0"
PREFIX_ROOT = "sidco-"
MTU_BYTES = 1500
FRAME_BYTES = MTU_BYTES + 14  # an Ethernet frame with its header
BURST_BYTES = 2 * FRAME_BYTES  # tbf bucket size at every rate (see tbf_parameters)
QUEUE_MIN_BYTES = 2 * 1024 * 1024  # least tbf queue limit (see tbf_parameters)


@dataclass(frozen=True)
class NetworkPlan:
    """Everything needed to build and remove one emulated network.

    ``setup`` and ``teardown`` are argv lists to run in order; ``addresses[i]`` is worker
    ``i``'s IPv4 address (no prefix length) inside namespace ``worker_ns[i]``. ``children`` are
    the processes the network needs while it stands (``(module, args…)``, run as
    ``python -m module args``: the WAN's delay line), started after ``setup`` and stopped before
    ``teardown``.
    """

    prefix: str
    workers: int
    bandwidth_bps: float | None
    bridge_ns: str
    worker_ns: tuple[str, ...]
    addresses: tuple[str, ...]
    ifname: str
    setup: tuple[tuple[str, ...], ...]
    teardown: tuple[tuple[str, ...], ...]
    children: tuple[tuple[str, ...], ...] = ()

    def exec_prefix(self, rank: int) -> list[str]:
        """The argv prefix that runs a command inside worker ``rank``'s namespace."""
        return ["ip", "netns", "exec", self.worker_ns[rank]]


def unique_prefix() -> str:
    """A run-unique name prefix ``sidco-<pid>-<hex>`` for namespaces."""
    return f"{PREFIX_ROOT}{os.getpid()}-{secrets.token_hex(3)}"


TBF_MIN_BPS = 8.0
"""Slowest rate ``tc tbf`` takes (bits/s): its rate is whole bytes per second, so below one byte it is 0."""
TBF_MAX_LIMIT_BYTES = 2**32 - 1
"""Largest tbf queue limit (a 32-bit field, bytes): it caps the rate through the 100 ms queue rule."""
TBF_MAX_BPS = TBF_MAX_LIMIT_BYTES * 8.0 / 0.1
"""Fastest rate whose 100 ms queue (see :func:`tbf_parameters`) ``tc tbf`` takes (bits/s): ~343.6 Gbit/s."""


def check_shaping(bandwidth_bps: float) -> float:
    """``bandwidth_bps`` (bits/s) when ``tc tbf`` can shape a link to it
    ([:data:`TBF_MIN_BPS`, :data:`TBF_MAX_BPS`]); ValueError (one line) otherwise, before any
    namespace is built."""
    if not TBF_MIN_BPS <= bandwidth_bps <= TBF_MAX_BPS:
        raise ValueError(f"bandwidth {bandwidth_bps:g} bits/s cannot be shaped: tc tbf takes "
                         f"{TBF_MIN_BPS:g} bit/s to {TBF_MAX_BPS / 1e9:.1f} Gbit/s (use --no-shaping above that)")
    return bandwidth_bps


def tbf_parameters(bandwidth_bps: float) -> tuple[int, int]:
    """Return ``(burst_bytes, limit_bytes)`` for a tbf at ``bandwidth_bps`` (bits/s).

    Burst rule: :data:`BURST_BYTES` (two full Ethernet frames) at every rate. After an idle
    gap the bucket is full and the first ``burst`` bytes of a message leave unshaped, so a
    message of ``m`` bytes is at most ``burst/m`` too fast (4.6 % at 64 KiB, 0.3 % at 1 MiB)
    whatever the rate; a burst of a fixed time (say 1 ms of traffic) would let whole sparse
    messages through unshaped at high rates. Two frames is the least a tbf takes without
    dropping full-size frames. The queue limit is :data:`QUEUE_MIN_BYTES` or 100 ms of
    traffic, whichever is larger: deep enough that TCP's window, not a tail drop, bounds what
    is in flight (with 100 ms alone, 125 kB at 10 Mbit/s, a 1 MiB all-reduce lost hundreds of
    segments to the queue, and a lost tail costs a 200 ms retransmission timeout).
    """
    check_shaping(bandwidth_bps)
    limit = max(QUEUE_MIN_BYTES, int(bandwidth_bps / 8.0 * 0.1))
    return BURST_BYTES, limit


def tbf(namespace: str, device: str, bandwidth_bps: float) -> tuple[str, ...]:
    """The command that shapes ``device``'s egress in ``namespace`` to ``bandwidth_bps`` (bits/s) by a tbf."""
    burst, limit = tbf_parameters(bandwidth_bps)
    return (
        "tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "tbf",
        "rate", f"{int(bandwidth_bps)}bit", "burst", str(burst), "limit", str(limit),
    )


def bridge(namespace: str) -> list[tuple[str, ...]]:
    """Commands that add bridge :data:`BRIDGE` to ``namespace`` (which must exist) and bring it up."""
    return [
        ("ip", "-n", namespace, "link", "add", BRIDGE, "type", "bridge"),
        ("ip", "-n", namespace, "link", "set", BRIDGE, "up"),
    ]


def worker_link(bridge_ns: str, port: str, ns: str, addr: str, bandwidth_bps: float | None) -> list[tuple[str, ...]]:
    """Commands that join worker namespace ``ns`` (address ``addr`` in a /24) to the bridge of
    ``bridge_ns`` by a veth whose bridge-side end is ``port``, both ends shaped to ``bandwidth_bps``
    (bits/s; ``None``: unshaped) by a tbf (:func:`tbf_parameters`)."""
    setup: list[tuple[str, ...]] = [
        ("ip", "-n", bridge_ns, "link", "add", port, "type", "veth", "peer", "name", IFNAME, "netns", ns),
        ("ip", "-n", bridge_ns, "link", "set", port, "master", BRIDGE),
        ("ip", "-n", bridge_ns, "link", "set", port, "up"),
        ("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", IFNAME),
        ("ip", "-n", ns, "link", "set", IFNAME, "up"),
        ("ip", "-n", ns, "link", "set", "lo", "up"),
    ]
    if bandwidth_bps is not None:
        setup += [tbf(ns, IFNAME, bandwidth_bps), tbf(bridge_ns, port, bandwidth_bps)]
    return setup


def make_plan(
    workers: int,
    bandwidth_bps: float | None,
    *,
    prefix: str | None = None,
    subnet: tuple[int, int] | None = None,
) -> NetworkPlan:
    """Plan a bridge namespace plus ``workers`` worker namespaces, shaped to ``bandwidth_bps``.

    ``bandwidth_bps`` (bits/s) of ``None`` leaves the links unshaped. ``subnet`` picks the
    private ``10.a.b.0/24`` network (random when omitted). Raises ``ValueError`` on a worker
    count outside 1..250, a bandwidth tc cannot shape (:func:`check_shaping`), or a prefix that is not ours.
    """
    if not 1 <= workers <= 250:
        raise ValueError(f"workers must be between 1 and 250, got {workers}")
    if bandwidth_bps is not None:
        check_shaping(bandwidth_bps)
    prefix = prefix or unique_prefix()
    if not prefix.startswith(PREFIX_ROOT) or any(ch.isspace() or ch == "/" for ch in prefix):
        raise ValueError(f"namespace prefix {prefix!r} must start with {PREFIX_ROOT!r} and hold no spaces or '/'")
    a, b = subnet or (100 + secrets.randbelow(100), secrets.randbelow(250))
    bridge_ns = f"{prefix}-br"
    worker_ns = tuple(f"{prefix}-w{i}" for i in range(workers))
    addresses = tuple(f"10.{a}.{b}.{i + 1}" for i in range(workers))

    setup: list[tuple[str, ...]] = [("ip", "netns", "add", bridge_ns)]
    setup += [("ip", "netns", "add", ns) for ns in worker_ns]
    setup += bridge(bridge_ns)
    for i, (ns, addr) in enumerate(zip(worker_ns, addresses)):
        setup += worker_link(bridge_ns, f"vp{i}", ns, addr, bandwidth_bps)
    teardown = tuple(("ip", "netns", "del", ns) for ns in (*worker_ns, bridge_ns))
    return NetworkPlan(
        prefix=prefix,
        workers=workers,
        bandwidth_bps=bandwidth_bps,
        bridge_ns=bridge_ns,
        worker_ns=worker_ns,
        addresses=addresses,
        ifname=IFNAME,
        setup=tuple(setup),
        teardown=teardown,
    )
