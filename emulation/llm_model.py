"""A decoder-only transformer in torch from a :class:`traces.llm.Config` (random weights), for the emulation.

:func:`build` returns a ``torch.nn.Module`` whose ``named_parameters()`` are exactly the tensors
:func:`traces.llm.tensors` lists for the same config (names, shapes, order): GPT-2 with its
``Conv1D`` weights stored (in, out), LLaMA/Mistral/Qwen2 with (out, in) ``Linear`` weights, RMSNorm,
rotary position embeddings, grouped-query attention, a SwiGLU MLP and, when tied, an LM head that is
the token embedding. A Mixtral-style MoE layer is not built (ValueError). :attr:`Transformer.blocks`
are the transformer blocks, the units FSDP2 shards one by one. The forward of a batch of token ids
(batch, tokens) returns the mean next-token cross-entropy loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from traces.llm import Config

ROPE_THETA = 10000.0  # rotary base; the emulation times compute, any base does the same work
NORM_EPS = 1e-5


class _Conv1D(nn.Module):
    """GPT-2's projection: ``weight`` (in, out), ``bias`` (out)."""

    def __init__(self, fan_in: int, fan_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(fan_in, fan_out) * 0.02)
        self.bias = nn.Parameter(torch.zeros(fan_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], -1)


class _RMSNorm(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * self.weight


def _rope(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of ``x`` (batch, heads, tokens, head_dim)."""
    tokens, dim = x.shape[-2], x.shape[-1]
    inv = ROPE_THETA ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angles = torch.outer(torch.arange(tokens, dtype=torch.float32), inv)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    half = dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


class _GPT2Attention(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.heads = c.heads
        self.c_attn = _Conv1D(c.hidden, 3 * c.hidden)
        self.c_proj = _Conv1D(c.hidden, c.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.c_attn(x).split(d, -1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class _GPT2MLP(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c_fc = _Conv1D(c.hidden, c.ffn)
        self.c_proj = _Conv1D(c.ffn, c.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class _GPT2Block(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.hidden, eps=NORM_EPS)
        self.attn = _GPT2Attention(c)
        self.ln_2 = nn.LayerNorm(c.hidden, eps=NORM_EPS)
        self.mlp = _GPT2MLP(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class _LlamaAttention(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.heads, c.kv_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden, c.heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.heads * c.head_dim, c.hidden, bias=c.o_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = _rope(self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2))
        k = _rope(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2))
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class _LlamaMLP(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden, c.ffn, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.hidden, c.ffn, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.ffn, c.hidden, bias=c.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _LlamaBlock(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.self_attn = _LlamaAttention(c)
        self.mlp = _LlamaMLP(c)
        self.input_layernorm = _RMSNorm(c.hidden)
        self.post_attention_layernorm = _RMSNorm(c.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class _Trunk(nn.Module):
    """The embeddings, blocks and final norm under the family's attribute names."""

    def __init__(self, c: Config):
        super().__init__()
        if c.family == "gpt2":
            self.wte = nn.Embedding(c.vocab, c.hidden)
            self.wpe = nn.Embedding(c.positions, c.hidden)
            self.h = nn.ModuleList(_GPT2Block(c) for _ in range(c.layers))
            self.ln_f = nn.LayerNorm(c.hidden, eps=NORM_EPS)
        else:
            self.embed_tokens = nn.Embedding(c.vocab, c.hidden)
            self.layers = nn.ModuleList(_LlamaBlock(c) for _ in range(c.layers))
            self.norm = _RMSNorm(c.hidden)


class Transformer(nn.Module):
    """The model of a config: ``transformer`` (GPT-2) or ``model`` (the LLaMA naming), and an untied
    ``lm_head``; :attr:`blocks` lists the transformer blocks."""

    def __init__(self, c: Config):
        super().__init__()
        if c.experts:
            raise ValueError("a mixture-of-experts model is not built in the emulation: choose a dense model")
        self.config = c
        self.gpt2 = c.family == "gpt2"
        trunk = _Trunk(c)
        if self.gpt2:
            self.transformer = trunk
        else:
            self.model = trunk
        if not c.tied:
            self.lm_head = nn.Linear(c.hidden, c.vocab, bias=False)

    @property
    def trunk(self) -> _Trunk:
        """The embeddings, blocks and final norm."""
        return self.transformer if self.gpt2 else self.model

    @property
    def blocks(self) -> list[nn.Module]:
        """The transformer blocks in order."""
        return list(self.trunk.h if self.gpt2 else self.trunk.layers)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of predicting each next token of ``tokens`` (batch, length; ids)."""
        trunk = self.trunk
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        if self.gpt2:
            x = trunk.wte(inputs) + trunk.wpe(torch.arange(inputs.shape[1]))
        else:
            x = trunk.embed_tokens(inputs)
        for block in self.blocks:
            x = block(x)
        x = trunk.ln_f(x) if self.gpt2 else trunk.norm(x)
        embedding = trunk.wte if self.gpt2 else trunk.embed_tokens
        logits = x @ (embedding.weight if self.config.tied else self.lm_head.weight).t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build(config: Config, seed: int = 0) -> Transformer:
    """The model of ``config`` with random weights drawn from ``seed`` (the same on every rank)."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = Transformer(config)
        for module in model.modules():
            if isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
        return model
    finally:
        torch.random.set_rng_state(generator_state)


def tokens(config: Config, batch: int, length: int, seed: int) -> torch.Tensor:
    """A batch of ``batch`` synthetic sequences of ``length`` + 1 token ids (uniform over the vocabulary)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab, (batch, length + 1), generator=generator)


def parameter_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters (each tensor's numel × element size)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())

