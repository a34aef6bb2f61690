"""``sidco bench``: runs end to end on a small vector, JSON shape, bad input."""

from __future__ import annotations

import json

import pytest
import torch

import compressors
from pipeline import bench as benchmark
from measuring.samples import gradient_like
from sidco.cli import main


def test_bench_json(capsys):
    code = main(["bench", "--size", "20000", "--densities", "0.1,0.01", "--repeats", "2", "--warmup", "2",
                 "--compressors", "none,topk,sidco-e,dgc", "--json"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["compressor"], r["density"]) for r in rows] == [
        ("none", 1.0), ("topk", 0.1), ("sidco-e", 0.1), ("dgc", 0.1), ("topk", 0.01), ("sidco-e", 0.01),
        ("dgc", 0.01)]
    for r in rows:
        for key in ("compressor", "density", "size", "device", "compress_ms", "decompress_ms", "floor_ms",
                    "achieved_over_target", "over_floor", "speedup_vs_topk"):
            assert key in r
        assert r["size"] == 20000 and r["device"] == "cpu"
        assert r["compress_ms"] > 0 and r["floor_ms"] > 0
        assert r["over_floor"] == pytest.approx(r["compress_ms"] / r["floor_ms"])
    topk = [r for r in rows if r["compressor"] == "topk"]
    assert all(r["achieved_over_target"] == 1.0 and r["speedup_vs_topk"] == pytest.approx(1.0) for r in topk)
    assert rows[0]["speedup_vs_topk"] is None


def test_bench_table_and_errors(capsys):
    assert main(["bench", "--size", "5000", "--densities", "0.1", "--repeats", "1", "--warmup", "0",
                 "--compressors", "sidco-p"]) == 0
    out = capsys.readouterr().out
    assert "compress ms" in out and "sidco-p" in out
    for args, word in ((["--densities", "0,0.1"], "densities"), (["--compressors", "zip"], "unknown compressor"),
                       (["--size", "0"], "size"), (["--threads", "0"], "threads")):
        assert main(["bench", "--size", "1000", "--repeats", "1", *args]) == 2
        err = capsys.readouterr().err
        assert word in err and len(err.strip().splitlines()) == 1


def test_gradient_like_is_seeded_and_heavy_tailed():
    a, b = gradient_like(100_000, seed=3), gradient_like(100_000, seed=3)
    assert torch.equal(a, b) and not torch.equal(a, gradient_like(100_000, seed=4))
    kurtosis = float(((a - a.mean()) ** 4).mean() / a.var() ** 2)
    assert kurtosis > 6.0  # Laplace alone has 6


@pytest.mark.gpu
def test_bench_runs_on_cuda():
    rows = benchmark.run(100_000, [0.01], device="cuda", names=["topk", "sidco-e", "sidco-gp"], repeats=2, warmup=2)
    assert all(r["device"].startswith("cuda") for r in rows)


def test_bench_rows_record_backend_and_device_and_run_dense_baselines_once():
    from pipeline import bench as benchmark
    from machine import device_identity

    rows = benchmark.run(20_000, [0.1, 0.01], names=["fp16", "powersgd", "topk"], repeats=1, warmup=1)
    assert [(r["compressor"], r["density"]) for r in rows] == [
        ("fp16", 1.0), ("powersgd", 1.0), ("topk", 0.1), ("topk", 0.01)]
    assert all(r["backend"] in ("native", "torch") for r in rows)
    assert rows[0]["backend"] == "torch" and rows[0]["wire_bytes"] == 2 * 20_000
    assert all(r["device_identity"] == device_identity("cpu") and r["device_identity"].startswith("cpu: ")
               for r in rows)


def test_bench_cpu_clock(capsys):
    assert main(["bench", "--size", "20000", "--densities", "0.01", "--repeats", "2", "--warmup", "1",
                 "--compressors", "sidco-e,dgc", "--threads", "1", "--clock", "cpu", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["clock"] for r in rows] == ["cpu", "cpu"] and all(r["compress_ms"] >= 0 for r in rows)
    with pytest.raises(ValueError, match="clock"):
        benchmark.run(1000, [0.1], names=["topk"], clock="sundial")


def test_error_feedback_bench_prints_a_time_for_every_case(capsys):
    from benchmarks import ef_bench

    assert ef_bench.main(["--size", "4096", "--warmup", "1", "--repeats", "1"]) == 0
    times = json.loads(capsys.readouterr().out)
    assert set(times) == {f"{name}@{density:g}" for name, density in ef_bench.CASES}
    assert all(t >= 0 for t in times.values())


@pytest.mark.parametrize("argv", [["--size", "0"], ["--repeats", "0"], ["--warmup", "-1"]])
def test_error_feedback_bench_refuses_bad_input_in_one_line(argv, capsys):
    from benchmarks import ef_bench

    assert ef_bench.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: need --size >= 1") and err.count("\n") == 1


def test_bench_runs_sidco_at_each_fixed_stage_count_beside_the_peers(capsys):
    code = main(["bench", "--size", "20000", "--densities", "0.01", "--repeats", "1", "--warmup", "2",
                 "--compressors", "topk,dgc,sidco-e", "--stages", "1,2,3", "--json"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["compressor"], r["stages"]) for r in rows][:2] == [("topk", None), ("dgc", None)]
    assert [r["stages"] for r in rows if r["compressor"] == "sidco-e"] == [1, 2, 3]
    assert main(["bench", "--size", "1000", "--repeats", "1", "--stages", "0"]) == 2
    err = capsys.readouterr().err
    assert "--stages" in err and len(err.strip().splitlines()) == 1


def test_bench_refuses_more_stages_than_the_density_allows_before_timing_anything(capsys):
    assert main(["bench", "--size", "10000", "--densities", "0.01", "--repeats", "1", "--stages", "1000"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "stages=1000" in err and "at most 7" in err
    with pytest.raises(ValueError, match="at most 10"):
        compressors.create("sidco-p", density=0.001, stages=11)
    assert compressors.create("sidco-p", density=0.001, stages=10).stages == 10
