"""A sweep's scenario claims: their owner is a process identity (host, boot, PID namespace, PID,
start time) with a lease kept alive by a heartbeat, so a rerun never waits forever on a claim
whose owner is gone, even when it got the dead owner's PID (a container's PID 1)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import dataclasses

import pytest

from processes.liveness import provably_gone, this_process
from results.claims import CLAIM_LEASE_S, lapsed
from results.store import MIGRATIONS, SCHEMA_VERSION, Store
from killing import kill_while_claiming

SIDCO = [sys.executable, "-m", "sidco"]
SWEEP = ["sweep", "--layout", "resnet50", "--nodes", "16,32", "--bandwidth", "1Gbit,10Gbit", "--latency",
         "10us,100us", "--compressors", "none,topk,sidco-e", "--densities", "0.1,0.01", "--fidelity", "des",
         "--bucket-mode", "layer", "--jobs", "1", "--chunk-size", "2", "--no-progress"]
TOTAL = 2 * 2 * 2 * (3 + 2 * 2)
"""Clusters × (none, fp16 and powersgd once each, as compare adds them, + the sparsifiers at each density)."""
IN_CONTAINER = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
"""A fresh PID namespace per run: the sweep is PID 1 there, every time (as in a container)."""


@pytest.mark.root
@pytest.mark.slow  # the rerun waits out the lease (CLAIM_LEASE_S)
def test_a_container_sweep_killed_and_rerun_as_the_same_pid_takes_its_claims_over(tmp_path):
    """The issue's repro: a sweep as PID 1 of its own PID namespace is SIGKILLed holding claims;
    the same command run the same way (PID 1 again, alive) does not wait on itself forever: it says
    on whom it waits and until when, takes the claims over when their lease expires, and finishes."""
    store = tmp_path / "r.sqlite"
    seen = kill_while_claiming(IN_CONTAINER + SIDCO + SWEEP + ["--store", str(store)], store, TOTAL)
    with sqlite3.connect(store) as conn:
        assert {r[0] for r in conn.execute("SELECT pid FROM claim_owners")} == {1}
    conn.close()
    rerun = subprocess.Popen(IN_CONTAINER + SIDCO + SWEEP + ["--store", str(store), "--json"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = rerun.communicate(timeout=CLAIM_LEASE_S + 60)
    except subprocess.TimeoutExpired:
        os.killpg(rerun.pid, signal.SIGKILL)
        out, err = rerun.communicate()
        pytest.fail(f"the rerun still waits after {CLAIM_LEASE_S + 60:.0f} s: {err[-300:]!r}")
    assert rerun.returncode == 0, err[-500:]
    summary = json.loads(out)
    assert summary["stored"] == TOTAL and summary["computed"] == TOTAL - seen
    assert "waiting for" in err and "pid 1 " in err, err[-500:]


def _owner(identity, heartbeat: float) -> dict:
    return {**dataclasses.asdict(identity), "heartbeat": heartbeat}


def test_an_owner_is_gone_only_where_its_process_provably_ended():
    """This process lives; the same PID with another start time (a PID reused, a container's PID 1
    after a restart) or a free PID has ended; in another PID namespace or boot it cannot be told."""
    me = this_process()
    assert me.pid == os.getpid() and me.boot_id and me.pid_ns.startswith("pid:[") and me.start_ticks is not None
    assert not provably_gone(me)
    assert provably_gone(dataclasses.replace(me, start_ticks=me.start_ticks + 1))
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert provably_gone(dataclasses.replace(me, pid=int(child.stdout)))
    assert not provably_gone(dataclasses.replace(me, pid_ns="pid:[1]", start_ticks=0))
    assert not provably_gone(dataclasses.replace(me, boot_id="another boot", start_ticks=0))
    assert not provably_gone(dataclasses.replace(me, boot_id="", pid_ns="", start_ticks=None))


def test_a_claim_lapses_when_its_owner_ended_or_its_lease_expired():
    now = time.time()
    me = this_process()
    assert not lapsed(_owner(me, now), now)
    assert lapsed(_owner(me, now - CLAIM_LEASE_S - 1), now)  # alive but not beating: stopped, or hung
    assert not lapsed(_owner(dataclasses.replace(me, pid_ns="pid:[1]"), now - CLAIM_LEASE_S + 1), now)
    assert lapsed(_owner(dataclasses.replace(me, pid_ns="pid:[1]"), now - CLAIM_LEASE_S - 1), now)
    assert lapsed(_owner(dataclasses.replace(me, start_ticks=me.start_ticks + 1), now), now)


def _claim_in_child(path, sweep_id: int, keys: list[str], owner: str, stop: bool = False) -> subprocess.Popen:
    """A process that claims ``keys`` for ``owner`` and then sleeps (stopping itself with SIGSTOP if ``stop``)."""
    code = ("import os, signal, sys, time; from results.store import Store; s = Store(sys.argv[1]);"
            f" print(sorted(s.claim_scenarios(int(sys.argv[2]), {keys!r}, {owner!r})), flush=True);"
            f" os.kill(os.getpid(), signal.SIGSTOP) if {stop} else None; time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code, str(path), str(sweep_id)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == repr(sorted(keys))
    return child


def test_a_stopped_claimant_blocks_another_run_only_for_its_lease(tmp_path):
    """A live claimant's claims hold while it beats; one stopped (SIGSTOP: alive, its PID its own)
    stops beating and loses them once the lease passes; one in another PID namespace is judged by
    its lease only."""
    path = tmp_path / "r.sqlite"
    with Store(path) as store:
        sweep_id, _ = store.get_or_create("sweeps", {"claims": 2}, total=4)
        stopped = _claim_in_child(path, sweep_id, ["a", "b"], "stopped", stop=True)
        try:
            assert store.claim_scenarios(sweep_id, ["a", "b", "c"], "second", lease_s=1.0) == {"c"}
            holders = store.scenario_claims(sweep_id, ["a", "b"], lease_s=1.0)
            assert {h["pid"] for h in holders.values()} == {stopped.pid} and not holders["a"]["lapsed"]
            time.sleep(1.2)
            assert store.scenario_claims(sweep_id, ["a"], lease_s=1.0)["a"]["lapsed"]
            assert store.claim_scenarios(sweep_id, ["a", "b", "c"], "second", lease_s=1.0) == {"a", "b", "c"}
        finally:
            stopped.kill()
            stopped.wait()


def test_a_heartbeat_keeps_a_live_runs_claims_past_the_lease(tmp_path):
    path = tmp_path / "r.sqlite"
    with Store(path) as store:
        sweep_id, _ = store.get_or_create("sweeps", {"claims": 3}, total=2)
        assert store.claim_scenarios(sweep_id, ["a"], "first") == {"a"}
        with store.claims_kept("first", every_s=0.1):
            time.sleep(1.5)
            assert store.claim_scenarios(sweep_id, ["a", "b"], "second", lease_s=1.0) == {"b"}
        time.sleep(1.2)  # the heartbeat ended with the body: the lease runs out
        assert store.claim_scenarios(sweep_id, ["a"], "second", lease_s=1.0) == {"a"}
        store.release_claims(sweep_id, "second")
        assert store.query("SELECT COUNT(*) FROM scenario_claims")[0][0] == 0
        assert store.query("SELECT COUNT(*) FROM claim_owners")[0][0] == 0


def test_a_v6_stores_claims_migrate_with_their_owner_and_lapse_by_their_lease(tmp_path):
    """Schema v8 moves a claim's PID to its owner (``claim_owners``) beside an identity a v6 store
    never had: migrated claims keep their owner and PID, beat last when they were claimed, and are
    taken over once that is older than the lease, even when their PID is a live process's."""
    path = tmp_path / "v6.sqlite"
    with sqlite3.connect(path) as raw:
        for step in MIGRATIONS[:6]:
            raw.executescript(step)
        raw.execute("INSERT INTO meta(key, value) VALUES('schema_version', '6')")
        raw.execute("INSERT INTO sweeps(id, config_key, config_json, total, created) VALUES(1, 'k', '{}', 3, 1.0)")
        raw.executemany("INSERT INTO scenario_claims VALUES(1, ?, 'old', ?, ?)",
                        [("a", os.getpid(), time.time() - CLAIM_LEASE_S - 5), ("b", os.getpid(), time.time())])
    raw.close()
    with Store(path) as store:
        assert store.query("SELECT value FROM meta WHERE key='schema_version'")[0][0] == str(SCHEMA_VERSION)
        holders = store.scenario_claims(1, ["a", "b"])
        assert {h["owner"] for h in holders.values()} == {"old"} and holders["a"]["pid"] == os.getpid()
        assert not holders["a"]["lapsed"]  # the owner's last beat: its latest claim
        assert store.claim_scenarios(1, ["a", "b", "c"], "new") == {"c"}
        assert store.claim_scenarios(1, ["a", "b"], "new", lease_s=0.0) == {"a", "b"}
