"""``sidco profile --model``: a model built in torch from its config, its training step timed on the
CPU, and projections anchored on the measurement (``--step-profile``)."""

from __future__ import annotations

import json
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from costs import anchor, devices
from costs.compute import OPTIMIZER_BYTES_PER_PARAMETER
from measuring import model_step
from results.store import Store
from sidco.cli import main
from traces import llm
from traces.workloads import llm as torch_llm

TINY = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 128}
"""A 2-layer LLaMA-style config with grouped-query attention (4 heads, 2 key-value heads)."""



@pytest.fixture(autouse=True)
def _threads_as_found():
    """sidco profile pins this process's threads and CPUs: give them back after each test."""
    import os

    threads, cpus = torch.get_num_threads(), os.sched_getaffinity(0)
    yield
    torch.set_num_threads(threads)
    os.sched_setaffinity(0, cpus)


STEP = ["--run-on", "cpu", "--batch-size", "4", "--tokens", "32", "--warmup", "1", "--repeats", "3"]


def _tiny(tmp_path, **changes):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({**TINY, **changes}))
    return path


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", llm.names())
def test_the_torch_module_has_the_tensors_traces_llm_lists(name):
    """Built on the meta device (nothing allocated), every shipped model's parameters are the
    rows of traces.llm in order, name and shape, so their counts agree exactly, and equal the
    count its publisher states: an exact oracle for both."""
    model = torch_llm.build(llm.load(name), "meta")
    built = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert built == [(r["name"], r["shape"]) for r in llm.layout(name)]
    total = sum(p.numel() for p in model.parameters())
    assert total == llm.parameter_count(llm.load(name)) == llm.published(name)


def test_moe_with_every_expert_alike_is_that_expert():
    """Top-k routing with renormalised weights: when all experts hold the same weights and a token
    goes to every one, the MoE layer's output is one expert's (weights summing to 1)."""
    config = llm.parse({**TINY, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2})
    moe = torch_llm.build(config, "cpu").model.layers[0].block_sparse_moe
    with torch.no_grad():
        for expert in moe.experts[1:]:
            for mine, first in zip(expert.parameters(), moe.experts[0].parameters()):
                mine.copy_(first)
    x = torch.randn(2, 5, config.hidden, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(moe(x), moe.experts[0](x), rtol=1e-5, atol=1e-6)


def test_gpt2_conv1d_is_a_linear_layer_stored_transposed():
    conv = torch_llm.Conv1D(6, 4)
    torch.nn.init.normal_(conv.weight)
    torch.nn.init.normal_(conv.bias)
    x = torch.randn(3, 2, 6)
    torch.testing.assert_close(conv(x), torch.nn.functional.linear(x, conv.weight.T, conv.bias))


@pytest.mark.parametrize("family", ["gpt2", "llama", "mixtral"])
def test_a_step_trains_each_family(family):
    """Forward, backward and AdamW run for each kind of block, and a few steps on one batch lower its loss."""
    raw = {**TINY, "model_type": family, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128}
    if family == "mixtral":
        raw.update(num_local_experts=4, num_experts_per_tok=2)
    config = llm.parse(raw)
    model = torch_llm.build(config, "cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, config.vocab, (2, 17), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(4):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).reshape(-1, config.vocab),
                                                 tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_a_tiny_model_profiled_on_cpu_anchors_the_projection(tmp_path, capsys):
    """CI's check: a 2-layer config profiled on the CPU in a few seconds, then projected on it:
    one node's iteration, its compute and optimizer, is batch / the measured samples/s exactly."""
    config, out, store = _tiny(tmp_path), tmp_path / "step.json", tmp_path / "r.sqlite"
    measured = _json(capsys, ["profile", "--model", str(config), *STEP, "--out", str(out), "--store", str(store),
                              "--json"])
    assert (measured["layers"], measured["layers_timed"], measured["scale"]) == (2, 2, 1.0)
    (run,) = measured["runs"]
    assert measured["step_s"] == statistics.median(run["seconds"]) and len(run["seconds"]) == 3
    assert measured["samples_per_s"] == pytest.approx(4 / measured["step_s"], rel=1e-12)
    assert measured["tokens_per_s"] == pytest.approx(32 * measured["samples_per_s"], rel=1e-12)
    with Store(store) as s:
        (row,) = s.step_profiles()
    assert (row["id"], row["device"], row["batch_size"], row["tokens"]) == (measured["step_profile_id"], "cpu", 4, 32)
    assert anchor.load_step(out).samples_per_s == pytest.approx(measured["samples_per_s"], rel=1e-12)

    result = _json(capsys, ["simulate", "--model", str(config), "--step-profile", str(out), "--batch-size", "4",
                            "--nodes", "1", "--bandwidth", "10Gbit", "--fidelity", "analytic", "--store", str(store),
                            "--json"])
    cpu = devices.get("cpu")
    optimizer = OPTIMIZER_BYTES_PER_PARAMETER * llm.parameter_count(llm.load(str(config))) / cpu.memory_bandwidth_Bps
    assert result["iteration_s"] == pytest.approx(4 / measured["samples_per_s"], rel=1e-9)
    assert result["forward_s"] + result["backward_s"] + result["optimizer_s"] == pytest.approx(
        4 / measured["samples_per_s"], rel=1e-9)
    assert result["optimizer_s"] == pytest.approx(optimizer, rel=1e-9)
    assert (result["device"], result["tokens"], result["compute_from"]) == ("cpu", 32, "profiled")
    assert f"sidco profile --model, {out}" in result["compute_source"]
    low, high = result["compute_band"]
    assert low <= min(measured["step_min_s"] / measured["step_s"], 0.95)
    assert high >= max(measured["step_max_s"] / measured["step_s"], 1.05)

    assert main(["compare", "--model", str(config), "--step-profile", str(out), "--batch-size", "4", "--nodes", "2",
                 "--bandwidth", "10Gbit", "--compressors", "none,topk", "--densities", "0.01", "--store",
                 str(store)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "compute from your measured training step (sidco profile --model, --step-profile)" in text
    sharded = _json(capsys, ["compare", "--model", str(config), "--step-profile", str(out), "--batch-size", "4",
                             "--nodes", "2", "--gpus-per-node", "2", "--parallel", "fsdp", "--bandwidth", "10Gbit",
                             "--compressors", "none,bf16", "--store", str(store), "--json"])
    assert {row["compute_from"] for row in sharded["rows"]} == {"profiled"}  # the rate anchors every plan


def test_a_subset_of_layers_is_scaled_to_the_full_depth_and_said(tmp_path, capsys):
    """--layers 1 of 2: the model without layers and with one are timed, and the step is
    t0 + 2 (t1 - t0) of their medians; the output says which layers and the factor."""
    config = _tiny(tmp_path)
    assert main(["profile", "--model", str(config), *STEP, "--layers", "1", "--store", str(tmp_path / "r.sqlite")]) == 0
    text = capsys.readouterr().out
    assert "layers 0-0 of 2 and the model without layers; the layers' time scaled x2 to 2" in text
    measured = _json(capsys, ["profile", "--model", str(config), *STEP, "--layers", "1", "--json",
                              "--store", str(tmp_path / "r.sqlite")])
    base, part = measured["runs"]
    assert (base["layers"], part["layers"], measured["layers_timed"], measured["scale"]) == (0, 1, 1, 2.0)
    t0, t1 = statistics.median(base["seconds"]), statistics.median(part["seconds"])
    assert measured["step_s"] == pytest.approx(t0 + 2 * (t1 - t0), rel=1e-12)
    assert measured["step_min_s"] == pytest.approx(measured["step_s"] * min(part["seconds"]) / t1, rel=1e-12)
    assert measured["step_max_s"] == pytest.approx(measured["step_s"] * max(part["seconds"]) / t1, rel=1e-12)
    assert "layers 0-0 of 2" in measured["source"]
    out = tmp_path / "step.json"
    anchor.step_from_json(json.dumps({k: v for k, v in measured.items() if k not in ("step_profile_id", "out")})
                          ).save(out)
    result = _json(capsys, ["simulate", "--model", str(config), "--step-profile", str(out), "--batch-size", "4",
                            "--nodes", "1", "--bandwidth", "10Gbit", "--fidelity", "analytic", "--json",
                            "--store", str(tmp_path / "r.sqlite")])
    assert "layers 0-0 of 2 timed, their time scaled x2" in result["compute_source"]
    assert result["iteration_s"] == pytest.approx(4 / measured["samples_per_s"], rel=1e-9)


def test_plan_layers_takes_the_most_that_fit():
    config = llm.load("llama-3.1-8b")
    need = [model_step.step_bytes(config, k, 1, 4096, "amp") for k in range(config.layers + 1)]
    assert need == sorted(need)
    for k in (0, 1, 7, config.layers):
        assert model_step.plan_layers(config, 1, 4096, "amp", int(need[k] / model_step.MEMORY_SHARE) + 1) == k


@pytest.mark.parametrize("flags, message", [
    ([], "--model needs --batch-size"),
    (["--batch-size", "4", "--parallel", "fsdp"], "--parallel fsdp is not measured yet"),
    (["--batch-size", "4", "--tokens", "4096"], "--tokens must be a whole number from 1 to 128"),
    (["--batch-size", "4", "--layers", "3"], "--layers must be from 1 to 2"),
    (["--batch-size", "x"], "invalid --batch-size 'x'"),
    (["--batch-size", "4", "--check"], "give --check or --model, not both"),
])
def test_bad_profile_arguments_end_in_one_line(tmp_path, capsys, flags, message):
    assert main(["profile", "--model", str(_tiny(tmp_path)), "--run-on", "cpu", *flags,
                 "--store", str(tmp_path / "r.sqlite")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def _step_file(tmp_path, **changes):
    config = llm.load(str(_tiny(tmp_path)))
    from dataclasses import asdict

    profile = anchor.StepProfile(model="tiny", config=asdict(config), device="cpu", precision="amp", parallel="ddp",
                                 batch_size=4, tokens=32, step_s=0.02, step_min_s=0.019, step_max_s=0.022, layers=2,
                                 layers_timed=2, scale=1.0, warmup=1, repeats=3)
    path = profile.save(tmp_path / "step.json")
    if changes:
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return path


@pytest.mark.parametrize("flags, message", [
    (["--batch-size", "8"], "was measured with --batch-size 4, the projection asks 8"),
    (["--batch-size", "4", "--precision", "fp32"], "was measured with --precision amp, the projection asks fp32"),
    (["--batch-size", "4", "--tokens", "64"], "was measured with --tokens 32, the projection asks 64"),
    (["--batch-size", "4", "--device", "h100"], "was measured with --device cpu, the projection asks h100"),
    (["--batch-size", "4", "--samples-per-s", "100"], "give --step-profile, --samples-per-s or --device-flops"),
])
def test_a_projection_off_the_measured_step_is_refused(tmp_path, capsys, flags, message):
    step = _step_file(tmp_path)
    assert main(["simulate", "--model", str(tmp_path / "tiny.json"), "--step-profile", str(step), *flags,
                 "--nodes", "1", "--bandwidth", "10Gbit", "--store", str(tmp_path / "r.sqlite")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_a_step_profile_of_another_model_or_device_is_refused(tmp_path, capsys):
    step = _step_file(tmp_path)
    for argv, message in ((["--model", "gpt2-124m"], "whose configuration is not --model gpt2-124m's"),
                          (["--layout", "gpt2"], "--step-profile applies to --model")):
        assert main(["simulate", *argv, "--step-profile", str(step), "--batch-size", "4", "--nodes", "1",
                     "--bandwidth", "10Gbit", "--store", str(tmp_path / "r.sqlite")]) == 2
        assert message in capsys.readouterr().err
    elsewhere = _step_file(tmp_path, device="nvidia-l4")
    assert main(["simulate", "--model", str(tmp_path / "tiny.json"), "--step-profile", str(elsewhere), "--batch-size",
                 "4", "--nodes", "1", "--bandwidth", "10Gbit", "--store", str(tmp_path / "r.sqlite")]) == 2
    assert "was measured on 'nvidia-l4', not one of the modelled devices" in capsys.readouterr().err


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(changes=st.dictionaries(st.sampled_from(["kind", "model", "config", "device", "precision", "parallel",
                                                "batch_size", "tokens", "step_s", "step_min_s", "step_max_s", "layers",
                                                "layers_timed", "scale", "warmup", "repeats", "runs", "identity",
                                                "created", "source"]), JSON, max_size=3))
def test_any_step_profile_file_reads_or_is_one_line(changes):
    """A step profile with arbitrary values in its fields reads, or fails with one ValueError line."""
    good = {"kind": "step", "model": "m", "config": {}, "device": "cpu", "precision": "amp", "parallel": "ddp",
            "batch_size": 4, "tokens": 32, "step_s": 0.02, "step_min_s": 0.01, "step_max_s": 0.03, "layers": 2,
            "layers_timed": 2, "scale": 1.0, "warmup": 1, "repeats": 3}
    try:
        profile = anchor.step_from_json(json.dumps({**good, **changes}))
    except ValueError as exc:
        assert "\n" not in str(exc)
    else:
        assert profile.samples_per_s > 0 and profile.step_min_s <= profile.step_s <= profile.step_max_s


def test_projecting_on_a_step_profile_imports_no_torch(tmp_path):
    """The measurement is read, not made: compare with --step-profile loads neither torch nor the measuring lab."""
    import subprocess
    import sys

    step = _step_file(tmp_path)
    code = ("import sys; from sidco.cli import main\n"
            "code = main(sys.argv[1:])\n"
            "print(code, ' '.join(sorted(m for m in sys.modules if m == 'torch' or m.startswith('measuring'))))")
    done = subprocess.run([sys.executable, "-c", code, "compare", "--model", str(tmp_path / "tiny.json"),
                           "--step-profile", str(step), "--batch-size", "4", "--nodes", "2", "--bandwidth", "10Gbit",
                           "--compressors", "none,topk", "--densities", "0.01", "--store", str(tmp_path / "r.sqlite")],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines()[-1].strip() == "0", done.stderr


def test_a_bad_config_or_a_missing_gpu_ends_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**TINY, "num_attention_heads": 5}))
    cases = [(["--model", str(bad), "--run-on", "cpu"], "field 'num_attention_heads' (5) must divide 'hidden_size'"),
             (["--model", str(tmp_path / "none.json"), "--run-on", "cpu"], "no such config file")]
    if not torch.cuda.is_available():
        cases.append((["--model", str(_tiny(tmp_path)), "--run-on", "cuda"], "CUDA is not available"))
    for argv, message in cases:
        assert main(["profile", *argv, "--batch-size", "2", "--store", str(tmp_path / "r.sqlite")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err


def test_moe_routes_each_token_to_its_top_k_experts():
    """The vectorised MoE layer against its definition, token by token: softmax over the router's
    logits, the k largest, renormalised, the sum of those experts' outputs so weighted."""
    config = llm.parse({**TINY, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2})
    moe = torch_llm.build(config, "cpu", seed=3).model.layers[0].block_sparse_moe
    x = torch.randn(2, 5, config.hidden, generator=torch.Generator().manual_seed(2))
    expected = []
    for token in x.reshape(-1, config.hidden):
        weights, chosen = torch.topk(torch.softmax(moe.gate(token), dim=-1), 2)
        weights = weights / weights.sum()
        expected.append(sum(w * moe.experts[int(e)](token) for w, e in zip(weights, chosen)))
    torch.testing.assert_close(moe(x), torch.stack(expected).view_as(x), rtol=1e-5, atol=1e-6)


def test_grouped_query_attention_is_attention_with_shared_key_value_heads():
    """LLaMA-style attention against its definition: causal softmax(q kᵀ / √d) v per head, query
    head h reading key-value head h // (heads / kv_heads), rotary positions on q and k."""
    config = llm.parse(TINY)
    attention = torch_llm.build(config, "cpu", seed=4).model.layers[0].self_attn
    b, t, d, hd = 2, 6, config.hidden, config.head_dim
    x = torch.randn(b, t, d, generator=torch.Generator().manual_seed(5))
    angles = torch.outer(torch.arange(t, dtype=torch.float32), 1.0 / 10000.0 ** (torch.arange(0, hd, 2) / hd))
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos(), angles.sin()
    q = attention.q_proj(x).view(b, t, config.heads, hd)
    k = attention.k_proj(x).view(b, t, config.kv_heads, hd)
    v = attention.v_proj(x).view(b, t, config.kv_heads, hd)

    def rotate(y):
        half = hd // 2
        return y * cos[:, None] + torch.cat((-y[..., half:], y[..., :half]), dim=-1) * sin[:, None]

    q, k = rotate(q), rotate(k)
    group = config.heads // config.kv_heads
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    heads = []
    for h in range(config.heads):
        scores = q[:, :, h] @ k[:, :, h // group].transpose(1, 2) / hd ** 0.5
        heads.append(torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v[:, :, h // group])
    expected = attention.o_proj(torch.cat(heads, dim=-1))
    torch.testing.assert_close(attention(x, cos, sin), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision", ["fp32", "tf32", "amp"])
def test_each_precision_times_its_steps(precision):
    times = model_step.time_step(llm.parse(TINY), torch.device("cpu"), 1, 2, 16, precision, warmup=1, repeats=2)
    assert times.layers == 1 and len(times.seconds) == 2 and all(s > 0 for s in times.seconds)


def test_what_settles_a_models_compute_is_its_measured_step():
    """When compute decides a verdict, the command that measures it for a model is sidco profile
    --model at the projection's batch, tokens and precision, its file then given as --step-profile."""
    from pipeline import project, settle
    from pipeline.request import Cluster, Request

    asked = project.resolve(Request(Cluster(4, 100e9, 50e-6), model="llama-3.2-1b", device="h100", batch_size=2,
                                    tokens=2048))
    (compute,) = [item for item in settle.inputs(asked.source, [], calibrated=True) if item.key == "compute"]
    assert settle.command(compute, asked, [], None) == (
        "sidco profile --model llama-3.2-1b --run-on cuda --batch-size 2 --tokens 2048 --precision amp --out step.json "
        "(then this comparison with --step-profile step.json)")


def test_a_planned_step_that_runs_out_of_memory_times_fewer_layers(monkeypatch):
    """The memory estimate can be short: a step that runs out of device memory is timed again with
    half the layers, and scaled up; with --layers given it ends in one line instead."""
    real = model_step.time_step
    refused = []

    def at_most_one_layer(config, device, layers, *args, **kwargs):
        if layers > 1:  # a device with room for one block beside the embeddings and the head
            refused.append(layers)
            raise torch.OutOfMemoryError("CUDA out of memory")
        return real(config, device, layers, *args, **kwargs)

    monkeypatch.setattr(model_step, "time_step", at_most_one_layer)
    config = llm.parse({**TINY, "num_hidden_layers": 4})
    measured = model_step.measure(config, torch.device("cpu"), 2, 16, "fp32", warmup=0, repeats=2)
    assert refused == [4, 2] and (measured.layers_timed, measured.scale) == (1, 4.0)
    assert [run.layers for run in measured.timed] == [0, 1]
    with pytest.raises(ValueError, match="a step of 2 of the model's 4 layers .* ran out of memory on cpu"):
        model_step.measure(config, torch.device("cpu"), 2, 16, "fp32", warmup=0, repeats=2, layers=2)
