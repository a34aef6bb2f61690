"""A decoder-only transformer built in torch from its config (:class:`traces.llm.Config`).

:func:`build` makes the torch module of a config (GPT-2, LLaMA, Mistral, Qwen2, Mixtral) with the
parameter names and shapes ``transformers`` registers, in the same order, so that its
``named_parameters()`` equal :func:`traces.llm.tensors` row by row. GPT-2: learned positions,
LayerNorm, fused QKV and MLP as ``Conv1D`` (weights stored (in, out)), GELU (tanh). The others:
RMSNorm, rotary positions (θ = 10⁴: the base does not change the work), grouped-query attention
(key-value heads repeated as ``transformers`` does), SwiGLU MLP, or Mixtral's MoE (a router,
softmax, top-k experts per token, their weights renormalised, each expert run on the tokens routed
to it). Attention is :func:`torch.nn.functional.scaled_dot_product_attention`, causal; sliding
windows are not applied. ``sidco profile --model`` times its step (:mod:`measuring.model_step`)
and the emulation trains it under FSDP2 (:mod:`emulation.llm_model`).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from traces.llm import Config


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Conv1D(nn.Module):
    """GPT-2's projection: ``weight`` stored (in, out), ``x @ weight + bias``."""

    def __init__(self, fan_in: int, fan_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(fan_in, fan_out))
        self.bias = nn.Parameter(torch.empty(fan_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], -1)


class GPT2Attention(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.heads = c.heads
        self.c_attn = Conv1D(c.hidden, 3 * c.hidden)
        self.c_proj = Conv1D(c.hidden, c.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (y.view(b, t, self.heads, -1).transpose(1, 2) for y in self.c_attn(x).split(d, dim=-1))
        return self.c_proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d))


class GPT2MLP(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c_fc = Conv1D(c.hidden, c.ffn)
        self.c_proj = Conv1D(c.ffn, c.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class GPT2Block(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.hidden)
        self.attn = GPT2Attention(c)
        self.ln_2 = nn.LayerNorm(c.hidden)
        self.mlp = GPT2MLP(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Body(nn.Module):
    """``transformer``: token and position embeddings, the blocks ``h``, the final ``ln_f``."""

    def __init__(self, c: Config, layers: int):
        super().__init__()
        self.wte = nn.Embedding(c.vocab, c.hidden)
        self.wpe = nn.Embedding(c.positions, c.hidden)
        self.h = nn.ModuleList(GPT2Block(c) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c.hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class Attention(nn.Module):
    """LLaMA-style attention: q, k, v, o projections, rotary positions, key-value heads repeated."""

    def __init__(self, c: Config):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.heads, c.kv_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden, c.heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.heads * c.head_dim, c.hidden, bias=c.o_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        if self.kv_heads != self.heads:
            k, v = (y.repeat_interleave(self.heads // self.kv_heads, dim=1) for y in (k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, c: Config):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden, c.ffn, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.hidden, c.ffn, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.ffn, c.hidden, bias=c.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Expert(nn.Module):
    """One of Mixtral's experts: ``w2(silu(w1(x)) * w3(x))``."""

    def __init__(self, c: Config):
        super().__init__()
        self.w1 = nn.Linear(c.hidden, c.ffn, bias=False)
        self.w2 = nn.Linear(c.ffn, c.hidden, bias=False)
        self.w3 = nn.Linear(c.hidden, c.ffn, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SparseMoE(nn.Module):
    """Mixtral's ``block_sparse_moe``: the router ``gate``, top-k experts per token, weights renormalised."""

    def __init__(self, c: Config):
        super().__init__()
        self.top_k = c.experts_per_token
        self.gate = nn.Linear(c.hidden, c.experts, bias=False)
        self.experts = nn.ModuleList(Expert(c) for _ in range(c.experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = torch.topk(F.softmax(self.gate(flat), dim=-1, dtype=torch.float32), self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(flat.dtype)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == e)
            if token.numel():
                out.index_add_(0, token, (expert(flat[token]) * weights[token, slot, None]).to(out.dtype))
        return out.view_as(x)


class Block(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.self_attn = Attention(c)
        if c.experts:
            self.block_sparse_moe = SparseMoE(c)
        else:
            self.mlp = MLP(c)
        self.input_layernorm = nn.RMSNorm(c.hidden)
        self.post_attention_layernorm = nn.RMSNorm(c.hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        ffn = self.block_sparse_moe if hasattr(self, "block_sparse_moe") else self.mlp
        return x + ffn(self.post_attention_layernorm(x))


class Body(nn.Module):
    """``model``: the token embedding, the blocks ``layers``, the final ``norm``."""

    def __init__(self, c: Config, layers: int):
        super().__init__()
        self.head_dim = c.head_dim
        self.embed_tokens = nn.Embedding(c.vocab, c.hidden)
        self.layers = nn.ModuleList(Block(c) for _ in range(layers))
        self.norm = nn.RMSNorm(c.hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(tokens)
        t = tokens.shape[1]
        inv = 1.0 / (10000.0 ** (torch.arange(0, self.head_dim, 2, device=tokens.device, dtype=torch.float32)
                                 / self.head_dim))
        angles = torch.outer(torch.arange(t, device=tokens.device, dtype=torch.float32), inv)
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        for block in self.layers:
            x = block(x, cos, sin)
        return self.norm(x)


class CausalLM(nn.Module):
    """The whole model: the body (``transformer`` for GPT-2, ``model`` otherwise) and the LM head
    (``lm_head``, sharing the token embedding when the config ties them)."""

    def __init__(self, c: Config, layers: int | None = None):
        super().__init__()
        depth = c.layers if layers is None else layers
        if c.family == "gpt2":
            self.transformer = GPT2Body(c, depth)
            embedding = self.transformer.wte
        else:
            self.model = Body(c, depth)
            embedding = self.model.embed_tokens
        self.lm_head = nn.Linear(c.hidden, c.vocab, bias=False)
        if c.tied:
            self.lm_head.weight = embedding.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        body = self.transformer if hasattr(self, "transformer") else self.model
        return self.lm_head(body(tokens))


def build(config: Config, device: str | torch.device = "cpu", layers: int | None = None,
          seed: int = 0, model_class: type[CausalLM] = CausalLM) -> CausalLM:
    """The torch module of ``config`` (a ``model_class``: :class:`CausalLM` or a subclass) on
    ``device`` with ``layers`` blocks (``None``: all of them), fp32 weights drawn from N(0, 0.02²)
    (norm weights 1, biases 0) with ``seed``; on the meta device nothing is allocated or drawn."""
    with torch.device(device):
        model = model_class(config, layers)
    if torch.device(device).type != "meta":
        generator = torch.Generator(device=torch.device(device)).manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif p.dim() == 1:
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02, generator=generator)
    return model
