"""The WAN's propagation delay where the kernel has no ``sch_netem``: a userspace delay line.

The WAN's two ends are TAP devices (``wan0`` in site 0's namespace, ``wan1`` in site 1's), each
a port of its site's bridge. This process holds both TAP file descriptors: every frame the kernel
hands to one end (read from its fd) is written into the other end's fd exactly ``--delay``
seconds after it was read, first in first out per direction (a constant delay keeps the order).
Time is ``time.monotonic``; the process sleeps in ``select`` until the next frame is due or one
arrives (no busy loop). The rate is the kernel's: a tbf on each TAP's egress (the kernel → line
direction, :func:`emulation.sites.make_sites_plan`) serialises the frames before the delay, as
netem's rate does.

Frames carry a ``virtio_net_hdr`` (``IFF_VNET_HDR``, with checksum and TSO offloads): the kernel
need not compute checksums for the line, and the header is written through unchanged, so the
receiving end takes each frame as the sending end gave it. The line holds every frame in flight
(the bandwidth-delay product, in memory); it adds no jitter and loses nothing, and it keeps up
only up to :data:`MAX_BPS` (one Python process moves every
frame). It exits when an end closes, when a site's namespace is gone (checked every
:data:`CHECK_S` seconds), or, started by :class:`emulation.network.Network`, with its parent
(:mod:`processes.children`); on an error it writes one line to stderr and exits 1.

Python 3.11 has no ``os.setns``: :func:`attach` calls libc's ``setns`` through ctypes to open a
TAP inside a namespace (:data:`NETNS_DIR`) and returns to its own namespace after.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import fcntl
import os
import select
import struct
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

TUN_PATH = "/dev/net/tun"
NETNS_DIR = "/var/run/netns"
"""Where ``ip netns`` mounts the namespaces it names."""
CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
TUNSETOFFLOAD = 0x400454D0
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000
TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6 = 0x01, 0x02, 0x04
FRAME_MAX_BYTES = 65_536 + 64
"""The largest read (bytes): a GSO frame of 64 KiB with its Ethernet and virtio headers."""
READ_BATCH = 64
"""Frames read from one end before the line looks at what is due (so neither direction starves)."""
CHECK_S = 1.0
"""Seconds between two checks that the sites' namespaces still stand."""
MAX_BPS = 200e6
"""The fastest WAN the line keeps up with (bits/s). Measured on a 2-core machine shared with other
jobs (``tests/test_emulation_sites.py``'s probe, 20 ms round trip, against the tbf alone plus
20 ms): 1 and 4 MB within 4 % at 100 Mbit/s and 10 % at 200 Mbit/s; at 300 Mbit/s some runs
within 3 %, others 20–30 % slow; at 500 Mbit/s and 1 Gbit/s 15–38 % slow. Each 1,514-byte frame
costs the line ~17 µs of CPU, mostly the kernel's delivery of the frame it writes."""


def check_rate(bandwidth_bps: float, why: str = "") -> float:
    """``bandwidth_bps`` (bits/s) when the line keeps up with it (≤ :data:`MAX_BPS`); ValueError (one
    line, after ``why``) otherwise."""
    if bandwidth_bps > MAX_BPS:
        raise ValueError(f"{why}the userspace delay line holds the WAN up to {MAX_BPS / 1e6:g} Mbit/s, "
                         f"not {bandwidth_bps / 1e6:g} Mbit/s")
    return bandwidth_bps


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


@contextmanager
def inside(namespace: str) -> Iterator[None]:
    """Run the block in network namespace ``namespace`` (named by ``ip netns``), then return to this one."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(os.path.join(NETNS_DIR, namespace), os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(target)
            try:
                yield
            finally:
                _setns(home)
        finally:
            os.close(target)
    finally:
        os.close(home)


def attach(namespace: str, device: str) -> int:
    """A non-blocking fd of TAP ``device`` in ``namespace`` (created there if missing, gone when the fd
    closes; a persistent one stays): frames with their virtio header, checksum and TSO offloads on."""
    with inside(namespace):
        fd = os.open(TUN_PATH, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", device.encode(), IFF_TAP | IFF_NO_PI | IFF_VNET_HDR))
        fcntl.ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6)
    except OSError as error:
        os.close(fd)
        raise OSError(error.errno, f"TAP {device} in {namespace}: {error.strerror}") from None
    return fd


def relay(ends: tuple[int, int], delay_s: float, standing: Callable[[], bool] = lambda: True) -> None:
    """Move every frame read from ``ends[i]`` (non-blocking fds, one frame a read) into ``ends[1 − i]``
    ``delay_s`` seconds after it was read, in order, until an end reads empty (closed) or
    ``standing()`` (asked every :data:`CHECK_S` s) is false. Frames still in the line are dropped."""
    lines: tuple[deque[tuple[float, bytes]], deque[tuple[float, bytes]]] = (deque(), deque())
    check_at = time.monotonic() + CHECK_S
    while True:
        now = time.monotonic()
        for line, out in zip(lines, (ends[1], ends[0])):
            while line and line[0][0] <= now:
                os.write(out, line.popleft()[1])
        if now >= check_at:
            if not standing():
                return
            check_at = now + CHECK_S
        wake = min([line[0][0] for line in lines if line] + [check_at])
        readable, _, _ = select.select(ends, (), (), max(0.0, wake - now))
        due = time.monotonic() + delay_s
        for fd in readable:
            line = lines[ends.index(fd)]
            for _ in range(READ_BATCH):
                try:
                    frame = os.read(fd, FRAME_MAX_BYTES)
                except BlockingIOError:
                    break
                if not frame:
                    return
                line.append((due, frame))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m emulation.delayline --delay S --end NS DEV --end NS DEV``: prints ``ready`` once
    both TAPs are attached, then relays until stopped (the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m emulation.delayline", allow_abbrev=False,
                                     description="Delay every frame between two TAP devices by a constant time.")
    parser.add_argument("--delay", type=float, required=True, help="one-way delay (s)")
    parser.add_argument("--end", nargs=2, action="append", required=True, metavar=("NAMESPACE", "DEVICE"),
                        help="a TAP device and its namespace; give two")
    args = parser.parse_args(argv)
    if len(args.end) != 2 or not args.delay >= 0:
        parser.error("give two --end and a --delay >= 0 s")
    fds: list[int] = []
    try:
        for namespace, device in args.end:
            fds.append(attach(namespace, device))
        print("ready", flush=True)
        relay((fds[0], fds[1]), args.delay,
              lambda: all(os.path.exists(os.path.join(NETNS_DIR, ns)) for ns, _ in args.end))
    except OSError as error:
        print(f"delay line: {error}", file=sys.stderr)
        return 1
    finally:
        for fd in fds:
            os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
