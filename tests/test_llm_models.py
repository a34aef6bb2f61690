"""Models from their config.json (traces.llm): published parameter counts, tensors and FLOPs against
equivalent torch modules, bad configs in one line, and projections of them without torch."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from traces import layouts, llm
from traces.llm.config import ConfigError, parse

ROOT = Path(__file__).resolve().parent.parent

PUBLISHED = {
    "gpt2-124m": 124_439_808,       # openai-community/gpt2 (tied LM head counted once)
    "gpt2-1.5b": 1_557_611_200,     # openai-community/gpt2-xl
    "llama-3.2-1b": 1_235_814_400,  # meta-llama/Llama-3.2-1B (tied embeddings)
    "llama-3.1-8b": 8_030_261_248,  # meta-llama/Llama-3.1-8B
    "llama-3.1-70b": 70_553_706_496,  # meta-llama/Llama-3.1-70B
    "mistral-7b": 7_241_732_096,    # mistralai/Mistral-7B-v0.1
    "qwen2.5-7b": 7_615_616_512,    # Qwen/Qwen2.5-7B
    "mixtral-8x7b": 46_702_792_704,  # mistralai/Mixtral-8x7B-v0.1
}
"""The parameter counts each model's Hugging Face repository publishes (its safetensors' total)."""


def test_the_shipped_models_are_the_published_ones():
    assert llm.names() == sorted(PUBLISHED)
    assert not set(llm.names()) & set(layouts.names())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_each_shipped_model_has_its_published_parameter_count_exactly(name):
    rows = llm.layout(name)
    assert sum(r["numel"] for r in rows) == PUBLISHED[name] == llm.published(name)
    assert llm.parameter_count(llm.load(name)) == PUBLISHED[name]
    assert all(r["numel"] == math.prod(r["shape"]) for r in rows)
    assert len({r["name"] for r in rows}) == len(rows)
    source = json.loads((llm.CONFIGS / f"{name}.json").read_text())["_source"]
    assert source["file"] == "config.json" and source["url"] == f"https://huggingface.co/{source['repo']}/blob/main/config.json"


# --- the oracle: torch modules built as transformers builds these families, on tiny configs --------


class Conv1D(nn.Module):
    """GPT-2's projection: weight stored (in, out)."""

    def __init__(self, fan_out: int, fan_in: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(fan_in, fan_out) * 0.02)
        self.bias = nn.Parameter(torch.zeros(fan_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight + self.bias


class GPT2Block(nn.Module):
    def __init__(self, d: int, heads: int, inner: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.attn = nn.Module()
        self.attn.c_attn, self.attn.c_proj = Conv1D(3 * d, d), Conv1D(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Module()
        self.mlp.c_fc, self.mlp.c_proj = Conv1D(inner, d), Conv1D(d, inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in self.attn.c_attn(self.ln_1(x)).split(d, -1))
        mixed = (q @ k.transpose(-1, -2)).softmax(-1) @ v
        x = x + self.attn.c_proj(mixed.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp.c_proj(nn.functional.gelu(self.mlp.c_fc(self.ln_2(x))))


class GPT2(nn.Module):
    def __init__(self, c: llm.Config) -> None:
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(c.vocab, c.hidden)
        self.transformer.wpe = nn.Embedding(c.positions, c.hidden)
        self.transformer.h = nn.ModuleList(GPT2Block(c.hidden, c.heads, c.ffn) for _ in range(c.layers))
        self.transformer.ln_f = nn.LayerNorm(c.hidden)
        self.lm_head = nn.Linear(c.hidden, c.vocab, bias=False)
        if c.tied:
            self.lm_head.weight = self.transformer.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = self.transformer
        x = t.wte(ids) + t.wpe(torch.arange(ids.shape[1]))
        for block in t.h:
            x = block(x)
        return self.lm_head(t.ln_f(x))


class RMSNorm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Attention(nn.Module):
    def __init__(self, c: llm.Config) -> None:
        super().__init__()
        self.c = c
        q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
        self.q_proj = nn.Linear(c.hidden, q, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.hidden, kv, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.hidden, kv, bias=c.qkv_bias)
        self.o_proj = nn.Linear(q, c.hidden, bias=c.o_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        c = self.c
        q = self.q_proj(x).view(b, s, c.heads, c.head_dim).transpose(1, 2)
        k, v = (p(x).view(b, s, c.kv_heads, c.head_dim).transpose(1, 2).repeat_interleave(c.heads // c.kv_heads, 1)
                for p in (self.k_proj, self.v_proj))
        mixed = (q @ k.transpose(-1, -2)).softmax(-1) @ v
        return self.o_proj(mixed.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, c: llm.Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden, c.ffn, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.hidden, c.ffn, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.ffn, c.hidden, bias=c.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Expert(nn.Module):
    def __init__(self, c: llm.Config) -> None:
        super().__init__()
        self.w1 = nn.Linear(c.hidden, c.ffn, bias=False)
        self.w2 = nn.Linear(c.ffn, c.hidden, bias=False)
        self.w3 = nn.Linear(c.hidden, c.ffn, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class SparseMoE(nn.Module):
    """Mixtral's block: a router picks ``experts_per_token`` experts per token; each runs on its tokens only."""

    def __init__(self, c: llm.Config) -> None:
        super().__init__()
        self.k = c.experts_per_token
        self.gate = nn.Linear(c.hidden, c.experts, bias=False)
        self.experts = nn.ModuleList(Expert(c) for _ in range(c.experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = self.gate(flat).softmax(-1).topk(self.k, -1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            if len(rows):
                out[rows] += weights[rows, slot, None] * expert(flat[rows])
        return out.view_as(x)


class DecoderLayer(nn.Module):
    def __init__(self, c: llm.Config) -> None:
        super().__init__()
        self.self_attn = Attention(c)
        if c.experts:
            self.block_sparse_moe = SparseMoE(c)
        else:
            self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden)
        self.post_attention_layernorm = RMSNorm(c.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        mlp = self.block_sparse_moe if hasattr(self, "block_sparse_moe") else self.mlp
        return x + mlp(self.post_attention_layernorm(x))


class CausalLM(nn.Module):
    """LlamaForCausalLM and the families that share its naming (Mistral, Qwen2, Mixtral)."""

    def __init__(self, c: llm.Config) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(c.vocab, c.hidden)
        self.model.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.layers))
        self.model.norm = RMSNorm(c.hidden)
        self.lm_head = nn.Linear(c.hidden, c.vocab, bias=False)
        if c.tied:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(self.model.norm(x))


def _llama(**extra) -> dict:
    return {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 2,
            "num_hidden_layers": 3, "intermediate_size": 96, "vocab_size": 211, "max_position_embeddings": 64, **extra}


TINY = {
    "gpt2 tied": {"model_type": "gpt2", "n_embd": 48, "n_head": 4, "n_layer": 2, "n_positions": 32, "vocab_size": 101},
    "gpt2 untied, n_inner": {"model_type": "gpt2", "n_embd": 48, "n_head": 4, "n_layer": 2, "n_positions": 32,
                             "vocab_size": 101, "n_inner": 80, "tie_word_embeddings": False},
    "llama gqa untied": _llama(),
    "llama tied, biases, head_dim": _llama(tie_word_embeddings=True, attention_bias=True, mlp_bias=True, head_dim=16),
    "mistral": {**_llama(), "model_type": "mistral", "num_key_value_heads": 4},
    "qwen2 (q/k/v biases)": {**_llama(), "model_type": "qwen2", "attention_bias": False},
    "mixtral moe": {**_llama(), "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
}


def _torch_model(config: llm.Config) -> nn.Module:
    torch.manual_seed(0)
    return GPT2(config) if config.family == "gpt2" else CausalLM(config)


@pytest.mark.parametrize("case", sorted(TINY))
def test_tensors_are_what_the_equivalent_torch_model_registers(case):
    config = parse(TINY[case], case)
    model = _torch_model(config)
    expected = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    rows = llm.tensors(config, 8)
    assert [(r["name"], r["shape"]) for r in rows] == expected
    assert llm.parameter_count(config) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("case", sorted(TINY))
def test_matmul_and_attention_flops_are_what_torch_counts(case):
    """FlopCounterMode counts the products (projections, LM head, attention scores and mixing); the
    layout adds one FLOP per embedding output element (a lookup) besides, and biases and norms that
    the counter does not count. A MoE's experts see exactly tokens × experts_per_token tokens in all."""
    config = parse(TINY[case], case)
    tokens = 24
    model = _torch_model(config)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(torch.randint(0, config.vocab, (1, tokens)))
    lookups = tokens * config.hidden * (2 if config.family == "gpt2" else 1)
    products = sum(r["forward_flops"] for r in llm.tensors(config, tokens) if len(r["shape"]) == 2) - lookups
    assert products == counter.get_total_flops()


def test_the_gpt2_model_is_the_measured_gpt2_layout():
    """GPT-2 small from its config equals the layout measured on the meta device (traces.layout_models)."""
    model, measured = llm.layout("gpt2-124m", 1024), layouts.layout("gpt2")
    assert sum(r["numel"] for r in model) == sum(r["numel"] for r in measured)
    assert sum(r["forward_flops"] for r in model) == pytest.approx(sum(r["forward_flops"] for r in measured), rel=1e-12)
    assert sorted(r["shape"] for r in model if len(r["shape"]) == 1) == sorted(r["shape"] for r in measured if len(r["shape"]) == 1)


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen2.5-7b", "mixtral-8x7b"])
def test_flops_per_token_are_the_palm_count(name):
    """Forward FLOPs per token = 2 × (active non-embedding parameters + LM head) + 4 × L × heads ×
    head_dim × tokens (PaLM, appendix B: a third of its 6N + 12·L·H·Q·T), within the norms, biases and lookups."""
    c = llm.load(name)
    for tokens in (1024, 4096):
        total = sum(r["forward_flops"] for r in llm.layout(name, tokens)) / tokens
        expert = 3 * c.hidden * c.ffn
        active = llm.parameter_count(c) - c.vocab * c.hidden * (1 if c.tied else 2)
        if c.experts:
            active -= (c.experts - c.experts_per_token) * expert * c.layers
        palm = 2 * (active + c.vocab * c.hidden) + 4 * c.layers * c.heads * c.head_dim * tokens
        assert total == pytest.approx(palm, rel=1e-3)


def test_moe_counts_only_the_active_experts():
    dense = {**json.loads((llm.CONFIGS / "mixtral-8x7b.json").read_text()), "num_experts_per_tok": 8}
    top2, all8 = llm.load("mixtral-8x7b"), parse(dense)
    per_layer = 3 * top2.hidden * top2.ffn * 2.0 * 4096 * top2.layers
    diff = sum(r["forward_flops"] for r in llm.tensors(all8, 4096)) - sum(r["forward_flops"] for r in llm.tensors(top2, 4096))
    assert diff == pytest.approx(per_layer * 6, rel=1e-12)
    assert llm.parameter_count(all8) == llm.parameter_count(top2)


def test_null_fields_take_the_familys_default():
    """transformers reads a null n_inner, num_key_value_heads or head_dim as absent."""
    gpt2 = parse({**TINY["gpt2 tied"], "n_inner": None})
    assert gpt2.ffn == 4 * gpt2.hidden
    llama = parse(_llama(num_key_value_heads=None, head_dim=None))
    assert llama.kv_heads == llama.heads and llama.head_dim == llama.hidden // llama.heads


def test_tokens_default_and_limits():
    assert llm.stated("llama-3.1-8b") == llm.DEFAULT_TOKENS == 4096 and llm.stated("gpt2-124m") == 1024
    assert layouts.stated_tokens("mistral-7b") == 4096 and layouts.stated_tokens("bert-base") == 128
    assert layouts.max_tokens("llama-3.1-8b") == 131072 and layouts.max_tokens("gpt2-1.5b") == 1024
    assert layouts.check_tokens("mistral-7b", 32768) == 32768
    for bad in (0, 32769, 2.5, True):
        with pytest.raises(ValueError, match="--tokens"):
            layouts.check_tokens("mistral-7b", bad)
    assert layouts.flag("resnet50") == "--layout resnet50" and layouts.flag("qwen2.5-7b") == "--model qwen2.5-7b"


# --- bad configs: one line naming the field ------------------------------------------------------------

BAD = {
    "missing hidden_size": ({k: v for k, v in _llama().items() if k != "hidden_size"}, "'hidden_size' is missing"),
    "text layers": (_llama(num_hidden_layers="32"), "'num_hidden_layers' must be a whole number"),
    "fractional ffn": (_llama(intermediate_size=95.5), "'intermediate_size' must be a whole number"),
    "bool vocab": (_llama(vocab_size=True), "'vocab_size' must be a whole number"),
    "zero layers": (_llama(num_hidden_layers=0), "'num_hidden_layers' must be from 1"),
    "negative heads": (_llama(num_attention_heads=-8), "'num_attention_heads' must be from 1"),
    "absurd hidden": (_llama(hidden_size=1 << 20), "'hidden_size' must be from 1 to 65536"),
    "heads not dividing": (_llama(num_attention_heads=7, num_key_value_heads=7), "'num_attention_heads' (7) must divide 'hidden_size'"),
    "kv not dividing": (_llama(num_key_value_heads=3), "'num_key_value_heads' (3) must divide 'num_attention_heads'"),
    "gpt2 heads": ({"model_type": "gpt2", "n_embd": 50, "n_head": 4, "n_layer": 1, "n_positions": 8, "vocab_size": 9}, "'n_head' (4) must divide 'n_embd'"),
    "top-k above experts": ({**_llama(), "model_type": "mixtral", "num_local_experts": 2, "num_experts_per_tok": 3}, "'num_experts_per_tok' (3)"),
    "mixtral without experts": ({**_llama(), "model_type": "mixtral"}, "'num_local_experts' is missing"),
    "unknown family": (_llama(model_type="bert"), "'model_type' must be one of"),
    "tie not bool": (_llama(tie_word_embeddings="yes"), "'tie_word_embeddings' must be true or false"),
    "too many parameters": (_llama(hidden_size=65536, num_attention_heads=64, num_key_value_heads=64,
                                   num_hidden_layers=1024, intermediate_size=1 << 18), "more than 1e+13"),
    "not an object": ([1, 2], "holds a JSON object"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_config_ends_in_one_line_naming_the_field(case):
    raw, message = BAD[case]
    with pytest.raises(ConfigError) as caught:
        parse(raw, "cfg.json")
    text = str(caught.value)
    assert message in text and "\n" not in text and text.startswith("cfg.json: ")


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=8)
FIELDS = ["model_type", "hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "head_dim",
          "intermediate_size", "vocab_size", "max_position_embeddings", "tie_word_embeddings", "num_local_experts",
          "num_experts_per_tok", "n_embd", "n_head", "n_layer", "n_positions", "n_inner", "attention_bias"]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(FIELDS), JSON | st.integers(0, 5000) | st.sampled_from(["gpt2", "llama", "mixtral", "qwen2"])))
def test_any_json_object_is_a_model_or_one_line(raw):
    try:
        config = parse(raw, "x.json")
    except ConfigError as exc:
        assert "\n" not in str(exc)
    else:
        assert llm.parameter_count(config) == sum(r["numel"] for r in llm.tensors(config, 2))


def _sidco(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sidco", *argv], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_the_command_line_refuses_a_bad_config_in_one_line(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps(_llama(num_key_value_heads=3)))
    done = _sidco("simulate", "--model", str(bad), "--nodes", "2", "--bandwidth", "10Gbit", "--store", str(tmp_path / "r.sqlite"))
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and "num_key_value_heads" in done.stderr
    done = _sidco("compare", "--model", str(tmp_path / "absent.json"), "--nodes", "2", "--bandwidth", "10Gbit",
                  "--store", str(tmp_path / "r.sqlite"))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and "unknown model" in done.stderr


@pytest.mark.parametrize("model, nodes", [("llama-3.2-1b", "2"), ("llama-3.1-70b", "128")])
def test_a_model_projects_through_ddp_buckets_without_torch(tmp_path, model, nodes):
    """sidco simulate --model answers: the workload is the model's tensors (fp32 gradients) in DDP
    buckets, compute from its FLOPs; no torch is imported (a 70B model on 1,024 GPUs too)."""
    code = ("import sys, io, contextlib, json\nfrom sidco.cli import main\nout = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n    main(sys.argv[1:])\n"
            "print(json.dumps({'torch': 'torch' in sys.modules, 'out': json.loads(out.getvalue())}))")
    argv = ["simulate", "--model", model, "--device", "h100", "--nodes", nodes, "--gpus-per-node", "8",
            "--bandwidth", "100Gbit", "--compressor", "topk", "--density", "0.01", "--fidelity", "analytic",
            "--json", "--store", str(tmp_path / "r.sqlite")]
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    assert not found["torch"]
    (result,) = found["out"] if isinstance(found["out"], list) else [found["out"]]
    assert result["tokens"] == 4096 and result["iteration_s"] > 0 and result["workers"] == 8 * int(nodes)


def test_the_request_takes_a_model_as_its_one_workload(tmp_path):
    from pipeline import project
    from pipeline.request import Cluster, Request

    cluster = Cluster(2, 100e9, 50e-6, options={"gpus_per_node": 8})
    with pytest.raises(ValueError, match="give one workload"):
        Request(cluster, layout="gpt2", model="gpt2-124m")
    with pytest.raises(ValueError, match="unknown layout"):
        Request(cluster, layout="llama-3.1-8b")
    config = tmp_path / "config.json"
    config.write_text((llm.CONFIGS / "mistral-7b.json").read_text())
    request = Request(cluster, model=str(config), device="h100",
                      batch_size=2, tokens=2048)
    assert request.model == str(config.resolve()) and request.computed == request.model
    workload = project.resolve(request).workload
    assert workload.nbytes == 4 * PUBLISHED["mistral-7b"]
    assert [layer.name for layer in workload.layers] == [r["name"] for r in llm.layout("mistral-7b")]
    flops = sum(r["forward_flops"] for r in llm.layout("mistral-7b", 2048))
    rate = project.resolve(request).source.device_flops_per_s
    assert workload.forward_s == pytest.approx(flops * 2 / rate, rel=1e-9)
    buckets = workload.buckets()
    assert sum(b.numel for b in buckets) == PUBLISHED["mistral-7b"]
    assert buckets[0].layers[0] == len(workload.layers) - 1  # backward starts at the LM head


def test_the_whatif_page_projects_a_model_as_sidco_simulate_does(tmp_path, capsys):
    """The What-if page offers the shipped models; its projection of one equals `sidco simulate --json`."""
    from dashboard import projection
    from results.store import Store
    from sidco.cli import main

    store_path = tmp_path / "r.sqlite"
    with Store(store_path) as store:
        assert {"label": "model: llama-3.2-1b", "value": "model:llama-3.2-1b"} in projection.sources(store)
        controls = projection.parse_controls("model:llama-3.2-1b", ["none", "topk"], "0.01", "8", "100Gbit", "50us",
                                             "ring", device="h100", tokens="2048")
        page = {row["compressor"]: row for row in projection.project(store, controls, "analytic")}
    for name in ("none", "topk"):
        capsys.readouterr()
        assert main(["simulate", "--model", "llama-3.2-1b", "--device", "h100", "--nodes", "8",
                     "--bandwidth", "100Gbit", "--topology", "ring", "--tokens", "2048", "--compressor", name,
                     *(["--density", "0.01"] if name != "none" else []), "--fidelity", "analytic",
                     "--store", str(store_path), "--json"]) == 0
        cli = json.loads(capsys.readouterr().out)
        for key in projection.RESULT_KEYS:
            assert page[name][key] == cli[key], (name, key)
    with pytest.raises(projection.ProjectionError):
        projection.workload_fields("model:")
