"""A :class:`traces.llm.config.Config`'s parameter tensors and per-sample forward FLOPs.

:func:`tensors` lists the tensors as ``transformers`` registers them (``named_parameters()`` of
``GPT2LMHeadModel``, ``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM``,
``MixtralForCausalLM``; a tied LM head is the token embedding and appears once): the parameter
order of :mod:`traces.layouts`, whose reverse is the order backward produces gradients and DDP
fills its buckets. GPT-2's ``Conv1D`` stores its weights as (in, out); the others' ``Linear`` as
(out, in). Mixtral's experts are listed as its checkpoints name them
(``block_sparse_moe.experts.E.w1``/``w2``/``w3``, one tensor each).

FLOPs are per sample of ``tokens`` tokens, a multiply and an add counting two, with the rules of
:mod:`traces.layouts`: a weight carries its matrix product (2 × in × out per token), a bias one
FLOP per output, a norm weight 4 per element and its bias 1, an embedding 1 per output element; the
attention scores and their mixing (4 × tokens × heads × head_dim per token and layer, not halved
for the causal mask: PaLM's 6N + 12·L·H·Q·T count, Chowdhery et al. 2022, appendix B) ride on the
output projection; the LM head's product (2 × hidden × vocab per token) rides on its weight, the
token embedding's when tied. A MoE layer's router costs 2 × hidden × experts per token and each
expert's weights their product × ``experts_per_token`` ÷ ``experts`` (the share of tokens an expert
sees when the router balances them), so only the active experts count.
"""

from __future__ import annotations

import math
from typing import Any

from traces.llm.config import Config

NORM_FLOPS = 4.0
"""FLOPs per element of a norm's weight (normalise ≈ 3, scale 1), as :mod:`traces.layout_models` counts."""


def _linear(prefix: str, fan_in: int, fan_out: int, bias: bool, share: float = 1.0,
            transposed: bool = False) -> list[tuple[str, tuple[int, ...], float]]:
    """A projection's weight (and bias) with per-token FLOPs × ``share``; ``transposed``: GPT-2's (in, out)."""
    shape = (fan_in, fan_out) if transposed else (fan_out, fan_in)
    rows = [(f"{prefix}.weight", shape, 2.0 * fan_in * fan_out * share)]
    if bias:
        rows.append((f"{prefix}.bias", (fan_out,), float(fan_out) * share))
    return rows


def _gpt2(c: Config, tokens: int) -> list[tuple[str, tuple[int, ...], float]]:
    d = c.hidden
    head = 2.0 * d * c.vocab
    rows = [("transformer.wte.weight", (c.vocab, d), d + (head if c.tied else 0.0)),
            ("transformer.wpe.weight", (c.positions, d), float(d))]
    for i in range(c.layers):
        p = f"transformer.h.{i}"
        attn = _linear(f"{p}.attn.c_proj", d, d, True, transposed=True)
        attn[0] = (attn[0][0], attn[0][1], attn[0][2] + 4.0 * tokens * d)
        rows += [(f"{p}.ln_1.weight", (d,), NORM_FLOPS * d), (f"{p}.ln_1.bias", (d,), float(d)),
                 *_linear(f"{p}.attn.c_attn", d, 3 * d, True, transposed=True), *attn,
                 (f"{p}.ln_2.weight", (d,), NORM_FLOPS * d), (f"{p}.ln_2.bias", (d,), float(d)),
                 *_linear(f"{p}.mlp.c_fc", d, c.ffn, True, transposed=True),
                 *_linear(f"{p}.mlp.c_proj", c.ffn, d, True, transposed=True)]
    rows += [("transformer.ln_f.weight", (d,), NORM_FLOPS * d), ("transformer.ln_f.bias", (d,), float(d))]
    if not c.tied:
        rows.append(("lm_head.weight", (c.vocab, d), head))
    return rows


def _llama(c: Config, tokens: int) -> list[tuple[str, tuple[int, ...], float]]:
    d, q, kv = c.hidden, c.heads * c.head_dim, c.kv_heads * c.head_dim
    head = 2.0 * d * c.vocab
    rows = [("model.embed_tokens.weight", (c.vocab, d), d + (head if c.tied else 0.0))]
    for i in range(c.layers):
        p = f"model.layers.{i}"
        out = _linear(f"{p}.self_attn.o_proj", q, d, c.o_bias)
        out[0] = (out[0][0], out[0][1], out[0][2] + 4.0 * tokens * q)
        rows += [*_linear(f"{p}.self_attn.q_proj", d, q, c.qkv_bias), *_linear(f"{p}.self_attn.k_proj", d, kv, c.qkv_bias),
                 *_linear(f"{p}.self_attn.v_proj", d, kv, c.qkv_bias), *out]
        if c.experts:
            share = c.experts_per_token / c.experts
            rows += _linear(f"{p}.block_sparse_moe.gate", d, c.experts, False)
            for e in range(c.experts):
                x = f"{p}.block_sparse_moe.experts.{e}"
                rows += [*_linear(f"{x}.w1", d, c.ffn, False, share), *_linear(f"{x}.w2", c.ffn, d, False, share),
                         *_linear(f"{x}.w3", d, c.ffn, False, share)]
        else:
            rows += [*_linear(f"{p}.mlp.gate_proj", d, c.ffn, c.mlp_bias), *_linear(f"{p}.mlp.up_proj", d, c.ffn, c.mlp_bias),
                     *_linear(f"{p}.mlp.down_proj", c.ffn, d, c.mlp_bias)]
        rows += [(f"{p}.input_layernorm.weight", (d,), NORM_FLOPS * d),
                 (f"{p}.post_attention_layernorm.weight", (d,), NORM_FLOPS * d)]
    rows.append(("model.norm.weight", (d,), NORM_FLOPS * d))
    if not c.tied:
        rows.append(("lm_head.weight", (c.vocab, d), head))
    return rows


def tensors(config: Config, tokens: int) -> list[dict[str, Any]]:
    """The parameter tensors of ``config`` in parameter order, one dict each: ``name``, ``shape``
    (tuple), ``numel`` and ``forward_flops`` (FLOPs per sample of ``tokens`` tokens; the module
    docstring has the rules)."""
    build = _gpt2 if config.family == "gpt2" else _llama
    return [{"name": name, "shape": shape, "numel": math.prod(shape), "forward_flops": per_token * tokens}
            for name, shape, per_token in build(config, tokens)]


def parameter_count(config: Config) -> int:
    """Parameters of ``config`` (a tied LM head counted once), in closed form, without listing tensors."""
    d, q, kv, f = config.hidden, config.heads * config.head_dim, config.kv_heads * config.head_dim, config.ffn
    if config.family == "gpt2":
        layer = 4 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d)
        total = config.vocab * d + config.positions * d + config.layers * layer + 2 * d
    else:
        attention = 2 * d * q + 2 * d * kv + (2 * kv + q if config.qkv_bias else 0) + (d if config.o_bias else 0)
        if config.experts:
            mlp = config.experts * 3 * d * f + d * config.experts
        else:
            mlp = 3 * d * f + (2 * f + d if config.mlp_bias else 0)
        total = config.vocab * d + config.layers * (attention + mlp + 2 * d) + d
    return total + (0 if config.tied else config.vocab * d)
