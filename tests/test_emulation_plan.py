"""Unit tests of the emulation's pure parts: the namespace/shaping plan, α–β forms, calibration fit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulation import network
from emulation.calibration import fit
from emulation.plan import FRAME_BYTES, IFNAME, make_plan, tbf_parameters, unique_prefix


def _targets_own_namespace(argv: tuple[str, ...], plan) -> bool:
    """Every command names one of the plan's namespaces (never the host's)."""
    ours = {plan.bridge_ns, *plan.worker_ns}
    if argv[:3] in (("ip", "netns", "add"), ("ip", "netns", "del")):
        return argv[3] in ours
    return argv[1] == "-n" and argv[2] in ours


def test_plan_three_workers_shaped():
    plan = make_plan(3, 100e6, prefix="sidco-1-abc", subnet=(120, 5))
    assert plan.bridge_ns == "sidco-1-abc-br"
    assert plan.worker_ns == ("sidco-1-abc-w0", "sidco-1-abc-w1", "sidco-1-abc-w2")
    assert plan.addresses == ("10.120.5.1", "10.120.5.2", "10.120.5.3")
    assert plan.setup[:4] == tuple(("ip", "netns", "add", ns) for ns in (plan.bridge_ns, *plan.worker_ns))
    veths = [c for c in plan.setup if "veth" in c]
    assert veths == [
        ("ip", "-n", "sidco-1-abc-br", "link", "add", f"vp{i}", "type", "veth", "peer", "name", IFNAME,
         "netns", f"sidco-1-abc-w{i}")
        for i in range(3)
    ]
    tbfs = [c for c in plan.setup if c[0] == "tc"]
    assert len(tbfs) == 6  # uplink and downlink of every worker
    shaped = {(c[2], c[6]) for c in tbfs}
    assert shaped == {(f"sidco-1-abc-w{i}", IFNAME) for i in range(3)} | {("sidco-1-abc-br", f"vp{i}") for i in range(3)}
    assert all(c[c.index("rate") + 1] == "100000000bit" for c in tbfs)
    assert ("ip", "-n", "sidco-1-abc-w1", "addr", "add", "10.120.5.2/24", "dev", IFNAME) in plan.setup
    assert set(plan.teardown) == {("ip", "netns", "del", ns) for ns in (plan.bridge_ns, *plan.worker_ns)}
    assert plan.exec_prefix(2) == ["ip", "netns", "exec", "sidco-1-abc-w2"]
    assert all(_targets_own_namespace(c, plan) for c in plan.setup + plan.teardown)


def test_plan_without_shaping_has_no_qdisc():
    plan = make_plan(2, None, prefix="sidco-2-def")
    assert not [c for c in plan.setup if c[0] == "tc"]
    assert len([c for c in plan.setup if "veth" in c]) == 2


@pytest.mark.parametrize(
    ("workers", "bandwidth", "prefix", "message"),
    [
        (0, 1e6, None, "workers"),
        (251, 1e6, None, "workers"),
        (2, 0.0, None, "bandwidth"),
        (2, -5.0, None, "bandwidth"),
        (2, 1e6, "host-ns", "prefix"),
        (2, 1e6, "sidco-a b", "prefix"),
    ],
)
def test_plan_rejects_bad_input(workers, bandwidth, prefix, message):
    with pytest.raises(ValueError, match=message):
        make_plan(workers, bandwidth, prefix=prefix)


def test_unique_prefixes_differ():
    prefixes = {unique_prefix() for _ in range(50)}
    assert len(prefixes) == 50
    assert all(p.startswith("sidco-") for p in prefixes)


@settings(max_examples=60, deadline=None)
@given(workers=st.integers(1, 40), bandwidth=st.floats(1e5, 1e11), shaped=st.booleans())
def test_plan_invariants(workers, bandwidth, shaped):
    plan = make_plan(workers, bandwidth if shaped else None)
    assert all(_targets_own_namespace(c, plan) for c in plan.setup + plan.teardown)
    assert len(set(plan.addresses)) == workers
    assert all(a.startswith("10.") for a in plan.addresses)
    assert len([c for c in plan.setup if c[0] == "tc"]) == (2 * workers if shaped else 0)
    assert len(plan.teardown) == workers + 1
    # every interface name fits the kernel's 15-character limit
    names = [c[c.index("add") + 1] for c in plan.setup if c[:2] == ("ip", "-n") and "add" in c and "link" in c]
    assert all(len(n) <= 15 for n in names)


@given(bandwidth=st.floats(1e5, 1e11))
def test_tbf_burst_shapes_every_grid_message(bandwidth):
    burst, limit = tbf_parameters(bandwidth)
    # the bucket passes a full-size frame (a smaller one drops them) ...
    assert burst >= FRAME_BYTES
    # ... and, at every rate, lets at most 5 % of a 64 KiB message (the grid's smallest) out unshaped
    assert burst <= 0.05 * 64 * 1024
    assert limit >= 2 * 1024 * 1024 and limit >= burst
    assert tbf_parameters(bandwidth * 2)[1] >= limit


def _ring_seconds(op, n, p, bandwidth_bps, alpha, efficiency):
    """The ring closed forms written out: all-reduce 2(p−1)α + 2(p−1)/p·n/B, all-gather of an
    n-byte output (p−1)α + (p−1)/p·n/B, B = efficiency × bandwidth in bytes/s."""
    B = efficiency * bandwidth_bps / 8
    if op == "allreduce":
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / B
    return (p - 1) * alpha + (p - 1) / p * n / B


@settings(max_examples=40, deadline=None)
@given(alpha=st.floats(0.0, 5e-3), efficiency=st.floats(0.3, 1.0))
def test_fit_recovers_constants(alpha, efficiency):
    rows = [
        {"op": op, "workers": p, "nbytes": n, "bandwidth_bps": b,
         "seconds": _ring_seconds(op, n, p, b, alpha, efficiency)}
        for op in ("allreduce", "allgather") for p in (2, 4) for n in (64e3, 1e6, 16e6) for b in (50e6, 200e6)
    ]
    result = fit(rows)
    assert result.alpha_s == pytest.approx(alpha, abs=1e-7)
    assert result.efficiency == pytest.approx(efficiency, rel=1e-6)
    assert result.reference_bandwidth_bps == 50e6
    assert result.beta_s_per_byte == pytest.approx(8 / (efficiency * 50e6), rel=1e-6)
    assert result.max_abs_error_pct < 1e-6


def test_fit_clamps_negative_alpha_and_reports_error():
    rows = [
        {"op": "allreduce", "workers": 2, "nbytes": 1e6, "bandwidth_bps": 100e6, "seconds": 0.05},
        {"op": "allreduce", "workers": 2, "nbytes": 4e6, "bandwidth_bps": 100e6, "seconds": 0.35},
    ]
    result = fit(rows)
    assert result.alpha_s == 0.0
    assert 0 < result.efficiency < 2
    assert result.max_abs_error_pct > 1


def test_fit_needs_two_shaped_points():
    with pytest.raises(ValueError, match="at least 2"):
        fit([{"op": "allreduce", "workers": 2, "nbytes": 1e6, "bandwidth_bps": None, "seconds": 0.1}])


def test_missing_requirements_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(network.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(network.shutil, "which", lambda tool: None)
    message = network.missing_requirements()
    assert "root" in message and "'ip'" in message and "'tc'" in message and "--no-shaping" in message
    assert "\n" not in message
    with pytest.raises(network.EmulationUnavailable, match="root"):
        network.require_emulation()


def test_a_failed_listing_names_the_command_its_exit_code_and_all_its_stderr(monkeypatch):
    import sys

    monkeypatch.setattr(network, "SHOW_RETRY_S", 0.0)
    argv = [sys.executable, "-c", "import sys; sys.stderr.write('Cannot open network namespace\\nsecond line\\n'); sys.exit(255)"]
    with pytest.raises(OSError, match="exit code 255: Cannot open network namespace / second line$"):
        network.show(argv, attempts=2)


def test_a_listing_that_fails_for_a_moment_is_tried_again(monkeypatch, tmp_path):
    import sys

    monkeypatch.setattr(network, "SHOW_RETRY_S", 0.0)
    tries = tmp_path / "tries"
    script = ("import pathlib, sys; p = pathlib.Path(sys.argv[1]); n = len(p.read_text()) if p.exists() else 0; "
              "p.write_text('x' * (n + 1)); sys.exit(255) if n < 2 else print('qdisc tbf 8001: root')")
    assert network.show([sys.executable, "-c", script, str(tries)], attempts=3) == "qdisc tbf 8001: root\n"
    assert tries.read_text() == "xxx"


def test_cli_without_root_is_one_line_exit_2(monkeypatch, capsys, tmp_path):
    from sidco.cli import main

    monkeypatch.setattr(network.os, "geteuid", lambda: 1000)
    code = main(["emulate", "collective", "--workers", "2", "--store", str(tmp_path / "r.sqlite")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0 and "root privileges" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["emulate", "collective", "--workers", "1", "--no-shaping"], "worker count 1"),
        (["emulate", "collective", "--workers", "two", "--no-shaping"], "worker count 'two'"),
        (["emulate", "collective", "--bandwidth", "100", "--workers", "2"], "invalid bandwidth"),
        (["emulate", "collective", "--bytes", "12", "--no-shaping"], "invalid size"),
        (["emulate", "collective", "--op", "broadcast", "--no-shaping"], "unknown collective"),
        (["calibrate"], "at least 2 shaped collective measurements"),
    ],
)
def test_cli_bad_input(argv, message, capsys, tmp_path):
    from sidco.cli import main

    code = main([*argv, "--store", str(tmp_path / "r.sqlite")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in err and "\n" not in err


def test_cli_collective_on_loopback_and_calibrate_refuses_unshaped(capsys, tmp_path):
    import json

    from sidco.cli import main
    from results.store import Store

    path = tmp_path / "r.sqlite"
    code = main(["emulate", "collective", "--no-shaping", "--workers", "2", "--op", "allreduce",
                 "--bytes", "64KB,256KB", "--repeats", "2", "--store", str(path), "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert [m["nbytes"] for m in out["measurements"]] == [64_000, 256_000]
    assert all(m["seconds"] > 0 and m["bandwidth_bps"] is None for m in out["measurements"])
    with Store(path) as store:
        assert store.query("SELECT status, kind, cores FROM emulations")[0]["status"] == "done"
        assert len(store.query("SELECT * FROM collective_measurements")) == 2
    assert main(["calibrate", "--store", str(path)]) == 2


def test_collective_span_runs_from_last_start_to_last_end():
    from emulation.collectives import _combine

    per_rank = [
        {"results": [{"op": "allreduce", "nbytes": 1000, "start": [10.0, 20.0, 30.0], "end": [10.5, 20.4, 30.2]}]},
        {"results": [{"op": "allreduce", "nbytes": 1000, "start": [10.1, 20.3, 30.0], "end": [10.6, 20.5, 30.3]}]},
    ]
    (row,) = _combine(per_rank, 2, 100e6)
    assert row["repeats_s"] == pytest.approx([0.5, 0.2, 0.3])
    assert row["seconds"] == pytest.approx(1.0 / 3), "the mean of the repeats: the expected time"
    assert row["op"] == "allreduce" and row["workers"] == 2 and row["bandwidth_bps"] == 100e6


def _passes(totals):
    """``totals[r][k]`` (s) as compute-only passes, split 40 % forward / 60 % backward."""
    return [[{"forward_s": 0.4 * t, "backward_s": 0.6 * t} for t in rank] for rank in totals]


def test_independent_jitter_ignores_what_every_rank_sees():
    from emulation.projection import independent_jitter

    drift = [0.05, 0.09, 0.04, 0.12]  # the whole machine slows down and speeds up (s)
    assert independent_jitter(_passes([drift, drift, drift])) == pytest.approx(0.0)
    # two ranks ±e around each pass's mean: d = ±e, σ = sqrt(e² · 2/1) relative to the mean
    e = 0.01
    totals = [[t + e for t in drift], [t - e for t in drift]]
    mean = sum(drift) / len(drift)
    assert independent_jitter(_passes(totals)) == pytest.approx((2 * e * e) ** 0.5 / mean)


def test_independent_jitter_recovers_iid_spread_under_common_drift():
    import numpy as np

    from emulation.projection import independent_jitter

    rng = np.random.default_rng(0)
    drift = 0.1 * (1 + 0.5 * rng.random(4000))  # common to all ranks: a CV of ~0.14 alone
    totals = [drift * (1 + 0.08 * rng.standard_normal(drift.size)) for _ in range(4)]
    estimate = independent_jitter(_passes([list(t) for t in totals]))
    assert estimate == pytest.approx(0.08 * float(np.mean(drift ** 2) ** 0.5) / float(np.mean(drift)), rel=0.05)


def test_independent_jitter_needs_two_ranks_with_passes():
    from emulation.projection import independent_jitter

    assert independent_jitter(_passes([[0.1, 0.2]])) is None
    assert independent_jitter(_passes([[0.1], []])) is None
    assert independent_jitter([]) is None


def test_network_share_is_transfer_time_over_iteration():
    import simulator
    from emulation.projection import network_share

    wl = simulator.Workload((simulator.Layer("a", 8_000_000, 0.010),), forward_s=0.020, optimizer_s=0.002, batch_size=1)
    r = simulator.simulate(simulator.Scenario(wl, 2, 8e9, 0.0, bucket_mode="single"))
    comm = 8_000_000 / 1e9  # ring all-reduce on 2 ranks: 2·(1/2)·n/B, B = 1e9 bytes/s
    assert network_share(r) == pytest.approx(comm / (0.020 + 0.010 + comm + 0.002), rel=1e-9)


def test_measured_iteration_is_the_mean_of_the_timed_iterations():
    """A run's measured time is the expected iteration time (what a time to accuracy adds up):
    with iterations at two speeds (gloo's 2-rank all-gather is a coin toss per call) the mean of
    each rank's iterations, averaged over ranks, not the speed that came up more often."""
    from emulation.training import summarize

    def rank(times):
        steps = [{"iteration_s": t, "forward_s": 0.01, "backward_s": 0.02, "optimizer_s": 0.001, "broadcast_s": 0.004}
                 for t in times]
        return {"steps": steps, "buckets": []}

    summary = summarize([rank([0.10, 0.10, 0.16]), rank([0.16, 0.16, 0.10])])
    assert summary["per_rank_iteration_s"] == pytest.approx([0.12, 0.14])
    assert summary["measured_s"] == pytest.approx(0.13)
    assert summary["phases_s"]["broadcast_s"] == pytest.approx(0.004)
