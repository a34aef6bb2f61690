"""User anchors (--samples-per-s, --tokens), the header's workload facts, and verdict.settle: what to measure."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from costs import anchor, devices
from costs.compute import OPTIMIZER_BYTES_PER_PARAMETER
import pipeline.request
import traces
from dashboard import projection as page
from pipeline import project, settle
from pipeline.request import Cluster, Request
from results.store import Store
from sidco.cli import build_parser, main
from simulator.band import scaled_costs
from simulator.simulate import iteration as simulate_alone

DONE = ["--layout", "bert-large", "--device", "a100", "--nodes", "16", "--gpus-per-node", "8", "--topology",
        "hierarchical", "--bandwidth", "25Gbit", "--compressors", "topk,sidco-e,dgc", "--densities", "0.001"]
"""The scenario of issue 33's acceptance: BERT-large on 16 × 8 A100s at 25 Gbit/s."""


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _closed_form_iteration(layout, tokens, batch, samples_per_s, device):
    """The compute a measured throughput implies, from the layout's parameters and FLOPs alone."""
    entries = traces.layouts.layout(layout, tokens)
    optimizer = OPTIMIZER_BYTES_PER_PARAMETER * sum(e["numel"] for e in entries) / device.memory_bandwidth_Bps
    rate = batch * 3 * sum(e["forward_flops"] for e in entries) / (batch / samples_per_s - optimizer)
    return optimizer, rate


@pytest.mark.parametrize("tokens, samples_per_s", [(None, 400.0), (384, 100.0)])
def test_a_measured_throughput_gives_exactly_the_compute_it_implies(tmp_path, capsys, tokens, samples_per_s):
    argv = ["simulate", "--layout", "bert-large", "--device", "a100", "--nodes", "1", "--bandwidth", "25Gbit",
            "--fidelity", "analytic", "--samples-per-s", str(samples_per_s), "--store", str(tmp_path / "r.sqlite"),
            "--json"] + (["--tokens", str(tokens)] if tokens else [])
    result = _json(capsys, argv)
    optimizer, rate = _closed_form_iteration("bert-large", tokens, 32, samples_per_s, devices.get("a100"))
    # one GPU, no compression: the projected iteration is the measured one, B / N
    assert result["iteration_s"] == pytest.approx(32 / samples_per_s, rel=1e-9)
    assert result["optimizer_s"] == pytest.approx(optimizer, rel=1e-9)
    assert result["forward_s"] == pytest.approx((32 / samples_per_s - optimizer) / 3, rel=1e-9)
    assert f"{rate / 1e12:.3g} TFLOP/s effective, from the measured" in result["compute_source"]
    assert result["compute_from"] == "measured" and result["compute_band"] == [0.95, 1.05]
    assert (result["batch_size"], result["precision"]) == (32, "amp")
    assert result["tokens"] == (tokens or 128) and result["tokens_stated"] == (tokens is None)


def test_a_measured_throughput_narrows_the_band_of_no_compression(tmp_path, capsys):
    store = ["--store", str(tmp_path / "r.sqlite"), "--json"]
    rule = {r["label"]: r for r in _json(capsys, ["compare", *DONE, *store])["rows"]}
    measured = {r["label"]: r for r in _json(capsys, ["compare", *DONE, "--samples-per-s", "400", *store])["rows"]}
    width = {name: rows["none"]["iteration_s_high"] / rows["none"]["iteration_s_low"]
             for name, rows in (("rule", rule), ("measured", measured))}
    assert width["measured"] < width["rule"]
    assert rule["none"]["compute_from"] == "rule" and measured["none"]["compute_from"] == "measured"
    lo, hi = measured["none"]["compute_band"]
    assert (lo, hi) == (1 - anchor.MEASUREMENT_NOISE, 1 + anchor.MEASUREMENT_NOISE)


BAD = [(["--samples-per-s", "0"], "--samples-per-s must be a finite number > 0, got 0.0"),
       (["--samples-per-s", "-4"], "--samples-per-s must be a finite number > 0, got -4.0"),
       (["--samples-per-s", "nan"], "--samples-per-s must be a finite number > 0, got nan"),
       (["--samples-per-s", "inf"], "--samples-per-s must be a finite number > 0, got inf"),
       (["--samples-per-s", "many"], "invalid --samples-per-s 'many'"),
       (["--samples-per-s", "1e-308"], "--samples-per-s 1e-308 is implausible for one GPU's training throughput"),
       (["--samples-per-s", "1e-300"], "--samples-per-s 1e-300 is implausible"),
       (["--samples-per-s", "2e8"], "--samples-per-s 200000000.0 is implausible"),
       (["--tokens", "0"], "--tokens must be a whole number from 1 to 512 for bert-large, got 0"),
       (["--tokens", "2.5"], "invalid --tokens '2.5'"),
       (["--samples-per-s", "400", "--device-flops", "1e14"], "give --samples-per-s or --device-flops, not both")]


@pytest.mark.parametrize("command", ["simulate", "compare", "sweep", "tta"])
@pytest.mark.parametrize("flags, message", BAD)
def test_bad_anchors_end_in_one_line_and_exit_2(tmp_path, capsys, command, flags, message):
    argv = [command, "--layout", "bert-large", "--nodes", "2", "--bandwidth", "25Gbit", *flags,
            "--store", str(tmp_path / "r.sqlite")]
    if command == "tta":
        curves = tmp_path / "curves.json"
        curves.write_text(json.dumps({"source": "test", "rows": [
            {"compressor": "none", "density": 1.0, "iteration": i, "loss": 1.0 / i, "accuracy": 0.3 * i}
            for i in (1, 2, 3)]}))
        argv = [*argv, "--target-accuracy", "0.5", "--curves", str(curves)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert not (tmp_path / "r.sqlite").exists()


def test_the_anchors_rules_have_one_home_both_doors_reach(monkeypatch):
    """The doors parse text and leave the range to the request: its one check runs once per
    request, and both doors fill the same fields."""
    args = build_parser().parse_args(["simulate", "--layout", "bert-large", "--nodes", "2", "--bandwidth",
                                      "25Gbit", "--samples-per-s", "-1", "--tokens", "0"])
    from sidco.commands.simulate import workload_fields

    fields = workload_fields(args)
    assert (fields["samples_per_s"], fields["tokens"]) == (-1.0, 0)  # parsed, not judged, at the door
    calls = []
    real = pipeline.request.check_anchors
    monkeypatch.setattr(pipeline.request, "check_anchors", lambda *a: calls.append(a) or real(*a))
    cli = Request(Cluster(2, 25e9, 50e-6), ("topk",), (0.01,), **{**fields, "samples_per_s": 400.0, "tokens": 384})
    assert calls == [("bert-large", 400.0, 384, None)]
    from_page = page.parse_controls("layout:bert-large", ["topk"], "0.01", "2", "25Gbit", "50us", "ring",
                                    samples_per_s="400", tokens="384")
    assert len(calls) == 2 and (from_page.samples_per_s, from_page.tokens) == (cli.samples_per_s, cli.tokens)
    for bad, message in ((("0", ""), "--samples-per-s must be a finite number > 0"),
                         (("", "0"), "--tokens must be a whole number")):
        with pytest.raises(page.ProjectionError, match=message):
            page.parse_controls("layout:bert-large", ["topk"], "0.01", "2", "25Gbit", "50us", "ring",
                                samples_per_s=bad[0], tokens=bad[1])
    with pytest.raises(ValueError, match="--samples-per-s applies to layouts"):
        Request(Cluster(2, 25e9, 50e-6), trace="t", samples_per_s=400.0)
    with pytest.raises(ValueError, match="takes no sequence length"):
        Request(Cluster(2, 25e9, 50e-6), layout="resnet50", tokens=384)


def test_the_header_states_batch_tokens_precision_compute_and_the_kernel_band(tmp_path, capsys):
    assert main(["compare", *DONE, "--samples-per-s", "400", "--tokens", "384", "--batch-size", "16",
                 "--store", str(tmp_path / "r.sqlite")]) == 0
    lines = []
    for line in capsys.readouterr().out.splitlines():  # prose is wrapped at 120 columns, its lines indented
        if line.startswith("  ") and lines and not line.lstrip()[:1].isdigit():
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    assert "from the measured 400 samples/s at batch 16" in lines[0]
    assert lines[1] == ("workload: batch 16 per worker, 384 tokens per sample (--tokens), precision amp; "
                        "compute from your measured throughput (--samples-per-s)")
    assert lines[2].startswith("kernel costs: modelled compression costs carry the bands of the kinds of kernel")
    assert "a --profile measured on your GPU" in lines[2]


def test_a_near_tie_names_the_kernel_that_flips_it_and_where(tmp_path, capsys):
    """SIDCo-E and Top-k at 0.001 on the acceptance scenario are projected within 0.1 %: Top-k's
    kernel band (its top-k evidence) flips their order; the value settle gives is where the
    re-projection ties."""
    out = _json(capsys, ["compare", *DONE, "--store", str(tmp_path / "r.sqlite"), "--json"])
    verdict, rows = out["verdict"], {r["label"]: r for r in out["rows"]}
    assert verdict["call"] == "too close to call"
    found = verdict["settle"]
    assert found["input"] == "kernel:topk@0.001" and found["flips"]
    assert found["command"].startswith("sidco profile --run-on cuda --compressors topk --densities 0.001")
    low, high = found["band"]
    assert low < found["flips_at"] < high and found["band"] == rows["topk@0.001"]["cost_band"]
    assert "measure it: sidco profile --run-on cuda" in verdict["text"]
    # independently: re-project both with Top-k's modelled costs just past and just short of the flip
    request = Request(Cluster(16, 25e9, 50e-6, "hierarchical", "analytic", {"gpus_per_node": 8}),
                      ("sidco-e", "topk"), (0.001,), layout="bert-large", device="a100")
    with Store(tmp_path / "r.sqlite") as store:
        sidco, topk = project.scenarios(store, project.resolve(request, store), ["sidco-e", "topk"], 0.001)
    step = 1.002 if found["flips_at"] > 1 else 1 / 1.002  # away from the point (1)
    for factor, topk_faster in ((found["flips_at"] * step, found["winner"] != "topk@0.001"),  # past: flipped
                                (found["flips_at"] / step, found["winner"] == "topk@0.001")):  # short of it: not
        moved = simulate_alone(replace(topk, profile=scaled_costs(topk.profile, factor)))["iteration_s"]
        assert (moved < simulate_alone(sidco)["iteration_s"]) == topk_faster


@pytest.mark.parametrize("scenario, call", [
    (["--layout", "vgg16", "--device", "v100", "--compressors", "topk", "--densities", "0.01"], "winner"),
    (["--layout", "gpt2", "--device", "a100", "--compressors", "sidco-e", "--densities", "0.001"], "too close to call"),
])
def test_when_no_input_alone_flips_it_the_closest_is_named(tmp_path, capsys, scenario, call):
    """PowerSGD wins VGG-16 on 8 V100s at 1 Gbit/s clearly; on GPT-2 on 8 A100s it is too close to
    call with SIDCo-E only when several inputs move at once: either way the input that comes
    closest is named, with its command."""
    out = _json(capsys, ["compare", *scenario, "--nodes", "8", "--bandwidth", "1Gbit",
                         "--store", str(tmp_path / "r.sqlite"), "--json"])
    verdict = out["verdict"]
    assert verdict["call"] == call and verdict["winner"] == "powersgd"
    found = verdict["settle"]
    assert not found["flips"] and found["flips_at"] is None and found["ratio_at_end"] > 1
    assert found["end"] in found["band"] and found["command"].startswith("sidco ")
    assert f"closest to flipping it: {found['name']}" in verdict["text"]


def test_the_compute_command_reruns_the_comparison_with_the_measured_throughput():
    request = Request(Cluster(16, 25e9, 50e-6, "hierarchical", options={"gpus_per_node": 8}), ("topk",), (0.001,),
                      layout="bert-large", device="a100", tokens=384)
    asked = project.resolve(request)
    source = asked.source
    (compute,) = [i for i in settle.inputs(source, [], calibrated=True) if i.key == "compute"]
    rows = [{"compressor": "topk", "density": 0.001}, {"compressor": "none", "density": None}]
    assert settle.command(compute, asked, rows, 1.2) == (
        "sidco compare --layout bert-large --device a100 --precision amp --batch-size 32 --tokens 384 "
        "--gpus-per-node 8 --nodes 16 --bandwidth 25Gbit/s --latency 50us --topology hierarchical "
        "--compressors topk,none --densities 0.001 --samples-per-s MEASURED")
    assert compute.band == (source.compute_low, source.compute_high)
