"""The recorder in a user's own loop, simulated data-parallel capture and ``sidco capture``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import traces
from sidco.cli import main
from results.store import Store


pytestmark = pytest.mark.usefixtures("one_thread")


def _tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def test_recorder_in_a_plain_loop(tmp_path: Path) -> None:
    model = _tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    recorded = {}
    with traces.Recorder(model, tmp_path / "mine", every=3, batch_size=4, workload="tiny") as rec:
        for step in range(1, 8):
            x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            rec.capture()
            if rec.recording:
                recorded[step] = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone()
            with rec.optimizer():
                optimizer.step()
            rec.step()
    t = traces.open(tmp_path / "mine")
    assert t.iterations == [3, 6] == sorted(recorded)
    assert t.workers == 1 and t.manifest["workload"] == "tiny" and t.manifest["every"] == 3
    assert t.layers == [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    for step, grad in recorded.items():
        assert torch.equal(t.gradient(step, 0), grad)
    timings = t.timings
    assert timings["batch_size"] == 4 and timings["device"] == "cpu" and timings["passes"] == 2
    assert timings["forward_s"] > 0 and timings["optimizer_s"] > 0
    assert len(timings["backward_s"]) == 4 and all(v >= 0 for v in timings["backward_s"])
    assert timings["backward_total_s"] == pytest.approx(sum(timings["backward_s"]))
    assert not model._forward_hooks and not model._forward_pre_hooks, "hooks removed on close"


class _SlowBackward(torch.autograd.Function):
    """Identity whose backward sleeps ``SLEEP_S`` seconds."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(SLEEP_S)
        return grad


class _Slow(nn.Module):
    def forward(self, x):
        return _SlowBackward.apply(x)


SLEEP_S = 0.1


def test_recorder_backward_timing_lands_on_the_right_layer(tmp_path: Path) -> None:
    """Backward work between two layers' gradients is charged to the earlier layer, split by size."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), _Slow(), nn.Linear(64, 4))
    rec = traces.Recorder(model, tmp_path / "t", every=1, batch_size=8)
    for _ in range(2):
        model.zero_grad()
        model(torch.randn(8, 64)).sum().backward()
        rec.capture()
        rec.step()
    t = rec.close()
    backward = dict(zip([n for n, _ in t.layers], t.timings["backward_s"]))
    assert backward["0.weight"] + backward["0.bias"] >= 0.95 * SLEEP_S
    assert backward["2.weight"] + backward["2.bias"] < 0.5 * SLEEP_S
    assert backward["0.weight"] == pytest.approx(64 * backward["0.bias"])
    assert t.timings["backward_total_s"] >= SLEEP_S


def test_recorder_refuses_missing_worker_and_leaves_nothing(tmp_path: Path) -> None:
    model = _tiny_model()
    with pytest.raises(traces.TraceError, match=r"worker\(s\) \[1\]"):
        with traces.Recorder(model, tmp_path / "t", every=1, workers=2) as rec:
            model(torch.randn(2, 8)).sum().backward()
            rec.capture(0)
            rec.step()
    assert list(tmp_path.iterdir()) == []


def test_capture_simulated_data_parallel(tmp_path: Path) -> None:
    seen: list[float] = []
    t = traces.capture(
        "transformer", tmp_path / "t", workers=3, iterations=4, every=2, width=0.25, batch_size=2,
        progress=lambda it, loss: seen.append(loss),
    )
    assert t.workers == 3 and t.iterations == [2, 4] and len(seen) == 4
    g = [t.gradient(4, w) for w in range(3)]
    assert not torch.equal(g[0], g[1]), "each worker has its own shard"
    assert t.manifest["capture"]["width"] == 0.25 and t.timings["batch_size"] == 2
    assert t.manifest["loss"]["per_iteration"] == pytest.approx(seen)
    assert t.manifest["environment"]["torch"] == torch.__version__


def test_capture_applies_the_averaged_gradient(tmp_path: Path) -> None:
    """Rebuilding the run by hand (per-worker gradients, their mean, one SGD step) gives the same trace."""
    kwargs = {"width": 0.25, "batch_size": 2, "lr": 0.05}
    t = traces.capture("resnet20", tmp_path / "t", workers=2, iterations=2, every=1, **kwargs)
    work = traces.workloads.build("resnet20", **kwargs)
    model, optimizer = work.model, work.optimizer()
    shards = [work.batches(w, 2) for w in range(2)]
    for iteration in (1, 2):
        grads = []
        for worker, shard in enumerate(shards):
            model.zero_grad()
            x, y = next(shard)
            work.loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
            flat = torch.cat([g.reshape(-1) for g in grads[-1]])
            assert torch.allclose(t.gradient(iteration, worker), flat, atol=1e-5, rtol=1e-4)
        for param, g0, g1 in zip(model.parameters(), *grads):
            param.grad = (g0 + g1) / 2
        optimizer.step()
    assert not torch.allclose(t.gradient(1, 0), t.gradient(2, 0)), "the model moved between iterations"


def test_capture_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(traces.TraceError, match="every"):
        traces.capture("resnet20", tmp_path / "t", iterations=5, every=10)
    with pytest.raises(ValueError, match="unknown workload"):
        traces.capture("alexnet", tmp_path / "t", iterations=5, every=1)
    assert not (tmp_path / "t").exists()


def test_sidco_capture_registers_the_trace(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    store_path = tmp_path / "r.sqlite"
    code = main(
        [
            "capture", "--workload", "resnet20", "--workers", "2", "--iterations", "2", "--every", "1",
            "--width", "0.25", "--batch-size", "2", "--out", str(tmp_path / "r20"), "--store", str(store_path), "--json",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    summary = json.loads(out.out)
    assert summary["workers"] == 2 and summary["recorded_iterations"] == 2
    with Store(store_path) as store:
        rows = store.traces()
    assert len(rows) == 1 and rows[0]["id"] == summary["trace_id"] and rows[0]["numel"] == summary["numel"]
    code = main(["capture", "--workload", "resnet20", "--iterations", "1", "--every", "1",
                 "--out", str(tmp_path / "r20"), "--store", str(store_path)])
    err = capsys.readouterr().err
    assert code == 2 and "already exists" in err and len(err.strip().splitlines()) == 1


def _bad_outs(tmp_path: Path) -> list[tuple[str, str]]:
    (tmp_path / "a-file").write_text("x")
    return [
        (os.fsdecode(os.fsencode(str(tmp_path)) + b"/bad\xff"), r"bad\xff: the path is not valid UTF-8"),
        (str(tmp_path / ("n" * 250)), "the trace directory's name is too long for this filesystem"),
        (str(tmp_path) + "/d" * 2100, "the path is too long"),
        (str(tmp_path / "a-file" / "t"), "a-file is a file, not a directory"),
        (str(tmp_path / "a-file"), "a-file: already exists"),
    ]


def test_a_bad_out_is_refused_in_one_line_before_training_or_the_store(tmp_path: Path, capsys) -> None:
    """--out is checked before the store is opened (so before any training): nothing is created."""
    store = tmp_path / "r.sqlite"
    for out, said in _bad_outs(tmp_path):
        code = main(["capture", "--workload", "resnet20", "--iterations", "1", "--every", "1", "--out", out,
                     "--store", str(store)])
        err = capsys.readouterr().err
        assert code == 2 and said in err and err.count("\n") == 1 and len(err) < 400, err[:400]
        assert not store.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


@pytest.mark.root
def test_an_out_on_a_read_only_mount_is_refused_before_training(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    done = subprocess.run(["unshare", "--mount", "sh", "-c", 'mount --bind -o ro "$1" "$1" && shift && exec "$@"', "sh",
                           str(folder), sys.executable, "-m", "sidco", "capture", "--workload", "resnet20",
                           "--iterations", "1", "--every", "1", "--out", str(folder / "t"),
                           "--store", str(tmp_path / "r.sqlite")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and f"{folder} is on a filesystem mounted read-only" in done.stderr, done.stderr
    assert not (tmp_path / "r.sqlite").exists()


def test_sidco_capture_help_states_units(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["capture", "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    assert "seconds" in out and "samples per worker" in out


@pytest.mark.gpu
def test_capture_on_cuda_times_with_events(tmp_path: Path) -> None:
    t = traces.capture("resnet20", tmp_path / "t", workers=2, iterations=2, every=1, width=0.25, batch_size=4, device="cuda")
    assert t.timings["device"].startswith("cuda")
    assert t.timings["forward_s"] > 0 and t.timings["backward_total_s"] > 0
    assert t.gradient(2, 1).device.type == "cpu" and bool(torch.isfinite(t.gradient(2, 1)).all())
