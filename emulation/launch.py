"""Start one real worker process per rank (inside its namespace, or on loopback) and collect results.

Each worker is ``python -m <module> --rank R --world-size W --master-addr A --master-port P
--out FILE [module args]``, started as a child that never imports from the working directory
and dies with this process (:func:`processes.children.module_argv`); it writes one JSON object to ``FILE``. The launcher fails fast
when any worker exits non-zero, kills every worker on timeout, failure or interrupt, and
returns the per-rank JSON objects in rank order.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from emulation.plan import NetworkPlan
from processes.children import module_argv

LOOPBACK_IFNAME = "lo"


class WorkerFailed(OSError):
    """A worker process exited with an error or did not finish in time."""


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker_environment(ifname: str) -> dict[str, str]:
    """Environment of a worker: gloo bound to ``ifname``, one compute thread per process."""
    env = dict(os.environ)
    env.update(
        GLOO_SOCKET_IFNAME=ifname,
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )
    return env


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def _kill(procs: Sequence[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for proc in procs:
        proc.wait()


def run_workers(
    module: str,
    args: Sequence[str],
    workers: int,
    plan: NetworkPlan | None,
    timeout_s: float,
) -> list[dict[str, Any]]:
    """Run ``workers`` processes of ``module`` (in ``plan``'s namespaces, or on loopback when
    ``plan`` is ``None``) and return their JSON results in rank order.

    Raises :class:`WorkerFailed` naming the rank and its last stderr line when a worker fails,
    or when the group runs longer than ``timeout_s`` seconds.
    """
    if plan is not None and plan.workers != workers:
        raise ValueError(f"plan has {plan.workers} namespaces but {workers} workers were asked for")
    master_addr = plan.addresses[0] if plan is not None else "127.0.0.1"
    master_port = 29500 if plan is not None else _free_loopback_port()
    env = worker_environment(plan.ifname if plan is not None else LOOPBACK_IFNAME)
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="sidco-emulation-") as tmp:
        workdir = Path(tmp)
        try:
            for rank in range(workers):
                argv = module_argv(
                    module,
                    "--rank", str(rank), "--world-size", str(workers),
                    "--master-addr", master_addr, "--master-port", str(master_port),
                    "--out", str(workdir / f"rank{rank}.json"), *args,
                )
                if plan is not None:
                    argv = plan.exec_prefix(rank) + argv
                with open(workdir / f"rank{rank}.err", "wb") as err:
                    procs.append(
                        subprocess.Popen(
                            argv, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
                        )
                    )
            deadline = time.monotonic() + timeout_s
            while any(proc.poll() is None for proc in procs):
                for rank, proc in enumerate(procs):
                    if proc.returncode not in (None, 0):
                        raise WorkerFailed(
                            f"{module} rank {rank} exited with code {proc.returncode}: "
                            f"{_last_line(workdir / f'rank{rank}.err')}"
                        )
                if time.monotonic() > deadline:
                    raise WorkerFailed(f"{module} workers did not finish within {timeout_s:g} s")
                time.sleep(0.05)
            for rank, proc in enumerate(procs):
                if proc.returncode != 0:
                    raise WorkerFailed(
                        f"{module} rank {rank} exited with code {proc.returncode}: "
                        f"{_last_line(workdir / f'rank{rank}.err')}"
                    )
            return [json.loads((workdir / f"rank{rank}.json").read_text()) for rank in range(workers)]
        finally:
            _kill(procs)
