"""Apply and remove a :class:`~emulation.plan.NetworkPlan`, always cleaning up.

:class:`Network` is a context manager: entering runs the plan's setup commands (removing
whatever it built if one fails), leaving runs the teardown whatever happened. SIGTERM and
SIGHUP are turned into :class:`Terminated` while it is active so ``finally`` blocks run. The
plan's ``children`` (the WAN's delay line) are started after the setup, each awaited until it
prints :data:`READY` (at most :data:`COMMAND_TIMEOUT_S`), and stopped before the teardown; they
die with this process (:func:`processes.children.module_argv`), and one that ended on its own
while the network stood is reported on leaving, with the last line it wrote to stderr.
Namespaces left by a run killed with SIGKILL (``sidco-<pid>-<hex>-…`` whose run has ended by the
one rule of :func:`processes.liveness.owner_ended`, over the owner record the run keeps in
:data:`OWNERS_DIR` while its network stands) are removed before a new network is built
(:func:`remove_stale`; ``sidco emulate --cleanup``).
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from emulation.plan import PREFIX_ROOT, NetworkPlan, make_plan
from processes.children import module_argv
from processes.liveness import OwnerFile, owner_ended, pid_alive

COMMAND_TIMEOUT_S = 20.0
SHOW_ATTEMPTS = 5
"""How often a read-only ``ip``/``tc`` listing is tried before its failure is raised: on a loaded
machine a listing can fail for a moment (a netlink dump interrupted by a change elsewhere)."""
SHOW_RETRY_S = 0.5
"""Seconds between two tries of a listing."""
READY = "ready"
"""The line a plan's child prints on stdout once the network may carry traffic."""


class EmulationUnavailable(ValueError):
    """Network emulation cannot run here (not root, or ``ip``/``tc`` missing)."""


class Terminated(BaseException):
    """Raised inside the main thread when SIGTERM/SIGHUP arrives during an emulation."""


def missing_requirements() -> str | None:
    """Return a one-line reason why namespaces cannot be built here, or ``None`` if they can."""
    missing = []
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        missing.append("root privileges")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            missing.append(f"the '{tool}' command (iproute2)")
    if not missing:
        return None
    return "network emulation needs " + " and ".join(missing) + "; use --no-shaping to run on loopback"


def require_emulation() -> None:
    """Raise :class:`EmulationUnavailable` with a one-line reason if namespaces can't be built."""
    reason = missing_requirements()
    if reason:
        raise EmulationUnavailable(reason)


def leftovers(prefix: str = PREFIX_ROOT) -> list[str]:
    """Names of existing network namespaces that start with ``prefix``."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    names = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    return sorted(name for name in names if name.startswith(prefix))


_OURS = re.compile(r"(?P<prefix>" + re.escape(PREFIX_ROOT) + r"(?P<pid>[0-9]+)-[0-9a-f]+)-")

OWNERS_DIR = Path("/run/sidco-netns")
"""Where a run keeps the owner record of its namespaces while its network stands (``<prefix>.json``,
:class:`processes.liveness.OwnerFile`: its identity and heartbeat); on tmpfs, as the namespaces are."""


def owner_record(prefix: str) -> Path:
    """The owner record of the namespaces named ``prefix``-… (:data:`OWNERS_DIR`)."""
    return OWNERS_DIR / f"{prefix}.json"


def stale() -> list[str]:
    """Namespaces named by this testbed (``sidco-<pid>-<hex>-…``) whose run has ended: by its owner
    record (:func:`processes.liveness.owner_ended`: provably gone, or no heartbeat for
    :data:`processes.liveness.OWNER_LEASE_S`, as a container's PID 1 killed and rerun), or, for a
    namespace without a record (built before records), by its pid alone."""
    found = []
    for name in leftovers(PREFIX_ROOT):
        match = _OURS.match(name)
        if match is None:
            continue
        gone = owner_ended(owner_record(match["prefix"]))
        if gone or (gone is None and not pid_alive(int(match["pid"]))):
            found.append(name)
    return found


def remove_stale() -> list[str]:
    """Delete the namespaces of :func:`stale` (left by a killed run); return their names.

    Only names of this testbed's form whose run has ended are touched, and their owner records; a
    namespace that vanished meanwhile is fine."""
    removed = []
    for name in stale():
        result = subprocess.run(["ip", "netns", "delete", name], capture_output=True, text=True,
                                timeout=COMMAND_TIMEOUT_S)
        if result.returncode == 0 or name not in leftovers(name):
            removed.append(name)
        else:
            raise OSError(f"cannot remove stale namespace {name}: {_failure(result.args, result)}")
    for name in removed:
        record = owner_record(_OURS.match(name)["prefix"])
        if owner_ended(record):
            record.unlink(missing_ok=True)
    return removed


def _failure(argv: Sequence[str], result: subprocess.CompletedProcess) -> OSError:
    """The error of a failed command: the command, its exit code and all it wrote to stderr
    (stdout when stderr is empty), on one line."""
    said = " / ".join(line.strip() for line in (result.stderr or result.stdout or "").splitlines() if line.strip())
    return OSError(f"'{' '.join(argv)}' failed with exit code {result.returncode}: {said or 'no message'}")


def _run(argv: Sequence[str]) -> None:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if result.returncode != 0:
        raise _failure(argv, result)


def show(argv: Sequence[str], attempts: int = SHOW_ATTEMPTS) -> str:
    """The stdout of the read-only listing ``argv`` (``tc -n NS -s qdisc show dev D``, ``ip -n NS addr``),
    tried up to ``attempts`` times :data:`SHOW_RETRY_S` seconds apart; :class:`OSError` with the
    command's exit code and stderr if every try failed."""
    for attempt in range(attempts):
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        if result.returncode == 0:
            return result.stdout
        if attempt + 1 < attempts:
            time.sleep(SHOW_RETRY_S)
    raise _failure(argv, result)


def qdisc(namespace: str, device: str, stats: bool = False) -> str:
    """``tc``'s listing of the queueing disciplines on ``device`` in ``namespace`` (with ``stats``:
    their counters, bytes and packets sent, dropped, overlimits), through :func:`show`."""
    return show(["tc", "-n", namespace, *(["-s"] if stats else []), "qdisc", "show", "dev", device])


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated(f"received signal {signum}")


class _Child:
    """One of a plan's children: ``python -m module args`` (``spec``), its stderr kept in a file."""

    def __init__(self, spec: Sequence[str]):
        self.module = spec[0]
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(module_argv(*spec), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self._stderr, start_new_session=True)

    def said(self) -> str:
        """The last line the child wrote to stderr."""
        self._stderr.seek(0)
        lines = [line.strip() for line in self._stderr.read().decode(errors="replace").splitlines() if line.strip()]
        return lines[-1] if lines else "no message"

    def await_ready(self, timeout_s: float) -> None:
        """Return once the child printed :data:`READY`; OSError (one line) if it ended, printed another
        line or said nothing within ``timeout_s`` seconds."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline().decode(errors="replace").strip() if ready else ""
        if line != READY:
            self.stop()
            raise OSError(f"{self.module} did not start within {timeout_s:g} s "
                          f"(exit code {self.proc.returncode}): {self.said()}")

    def ended(self) -> str | None:
        """Why the child ended on its own (one line), or ``None`` while it runs."""
        code = self.proc.poll()
        return None if code is None else f"{self.module} ended with exit code {code} while the network stood: " \
                                         f"{self.said()}"

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after :data:`COMMAND_TIMEOUT_S` seconds; wait for it."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=COMMAND_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self._stderr.close()


class Network:
    """The emulated network of ``plan``, built on enter and removed on exit."""

    def __init__(self, plan: NetworkPlan):
        self.plan = plan
        self._previous: dict[int, object] = {}
        self._owner: OwnerFile | None = None
        self._children: list[_Child] = []

    def __enter__(self) -> NetworkPlan:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGHUP):
                self._previous[signum] = signal.signal(signum, _raise_terminated)
        try:
            remove_stale()
            OWNERS_DIR.mkdir(mode=0o700, exist_ok=True)
            self._owner = OwnerFile(owner_record(self.plan.prefix)).start()
            for argv in self.plan.setup:
                _run(argv)
            for spec in self.plan.children:
                self._children.append(_Child(spec))
                self._children[-1].await_ready(COMMAND_TIMEOUT_S)
        except BaseException:
            self.teardown()
            raise
        return self.plan

    def __exit__(self, *exc: object) -> None:
        ended = [why for why in (child.ended() for child in self._children) if why]
        self.teardown()
        if ended:
            raise OSError(ended[0])

    def teardown(self) -> None:
        """Stop the plan's children, delete every namespace of the plan (missing ones are fine) and
        restore signals."""
        try:
            try:
                while self._children:
                    self._children.pop().stop()
            finally:
                existing = set(leftovers(self.plan.prefix))
                for argv in self.plan.teardown:
                    if argv[-1] in existing:
                        subprocess.run(list(argv), capture_output=True, timeout=COMMAND_TIMEOUT_S)
        finally:
            if self._owner is not None:
                self._owner.close()
                self._owner = None
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)
            self._previous.clear()


@contextmanager
def shaped_links(workers: int, bandwidth_bps: float | None) -> Iterator[NetworkPlan | None]:
    """The network ``workers`` ranks run in: ``None`` (loopback, unshaped) when ``bandwidth_bps`` is
    ``None``, else a :class:`Network` of :func:`emulation.plan.make_plan`'s links at ``bandwidth_bps``
    (bits/s), built on entry (:func:`require_emulation` first) and removed on exit."""
    if bandwidth_bps is None:
        yield None
        return
    require_emulation()
    with Network(make_plan(workers, bandwidth_bps)) as plan:
        yield plan
