"""A decoder-only transformer built in torch from its config, and its training step timed.

:func:`build` makes the torch module of a :class:`traces.llm.Config` (GPT-2, LLaMA, Mistral, Qwen2,
Mixtral) with the parameter names and shapes ``transformers`` registers, in the same order, so that
its ``named_parameters()`` equal :func:`traces.llm.tensors` row by row (the test holds every shipped
config to that, on the meta device). GPT-2: learned positions, LayerNorm, fused QKV and MLP as
``Conv1D`` (weights stored (in, out)), GELU (tanh). The others: RMSNorm, rotary positions (θ = 10⁴:
the base does not change the work), grouped-query attention (key-value heads repeated as
``transformers`` does), SwiGLU MLP, or Mixtral's MoE (a router, softmax, top-k experts per token,
their weights renormalised, each expert run on the tokens routed to it). Attention is
:func:`torch.nn.functional.scaled_dot_product_attention`, causal; sliding windows are not
applied (they span the whole of the default 4,096 tokens).

:func:`time_step` times one training step (forward, cross-entropy on the next token, backward,
AdamW) on synthetic tokens: ``warmup`` untimed steps, then ``repeats`` steps, each between two
device synchronisations (:func:`machine.timing.timed`). :func:`plan_layers` says how many layers
fit beside the rest when the whole model does not; :func:`measure` then times the model without
layers and with ``k`` of them and scales the layers' share to the full depth
(``step = t₀ + L/k · (t_k − t₀)``, :func:`scaled`). Units: seconds, bytes, samples, tokens.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from machine.timing import timed
from traces.llm import Config, parameter_count

ADAM_BYTES_PER_PARAMETER = 16
"""fp32 weight, gradient and AdamW's two moments: bytes per parameter of a step's states."""

ACTIVATION_BYTES_PER_TOKEN_HIDDEN = 34
"""Activation bytes kept for backward per token, per unit of hidden size and per layer in 16-bit
training (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
eq. 1, without the attention-score term that fused attention does not keep); doubled in fp32."""

LOGIT_COPIES = 3
"""fp32 copies of the logits a step holds at once (logits, their softmax, its gradient)."""

MEMORY_SHARE = 0.85
"""Share of the free device memory a planned step may take (the allocator's fragmentation and
the kernels' workspaces take the rest)."""


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
          seed: int = 0) -> CausalLM:
    """The torch module of ``config`` on ``device`` with ``layers`` blocks (``None``: all of
    them), fp32 weights drawn from N(0, 0.02²) (norm weights 1, biases 0) with ``seed``; on the
    meta device nothing is allocated or drawn."""
    with torch.device(device):
        model = CausalLM(config, layers)
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


def step_bytes(config: Config, layers: int, batch_size: int, tokens: int, precision: str) -> int:
    """Bytes a training step of ``config`` with ``layers`` blocks holds at its peak (estimated):
    :data:`ADAM_BYTES_PER_PARAMETER` per parameter, the activations
    (:data:`ACTIVATION_BYTES_PER_TOKEN_HIDDEN` per token, hidden unit and layer, twice in fp32)
    and :data:`LOGIT_COPIES` fp32 copies of the logits."""
    params = parameter_count(replace(config, layers=layers))
    per_layer = ACTIVATION_BYTES_PER_TOKEN_HIDDEN * (1 if precision == "amp" else 2) * config.hidden
    tokens_in_step = batch_size * tokens
    return (ADAM_BYTES_PER_PARAMETER * params + per_layer * layers * tokens_in_step
            + LOGIT_COPIES * 4 * tokens_in_step * config.vocab)


def plan_layers(config: Config, batch_size: int, tokens: int, precision: str, free_bytes: int) -> int:
    """How many blocks a step may hold within :data:`MEMORY_SHARE` of ``free_bytes``: all of
    them when the whole model fits (:func:`step_bytes`), else the most that fit (0 when not even
    the embeddings and the head do)."""
    budget = MEMORY_SHARE * free_bytes
    if step_bytes(config, config.layers, batch_size, tokens, precision) <= budget:
        return config.layers
    fitting = [k for k in range(config.layers) if step_bytes(config, k, batch_size, tokens, precision) <= budget]
    return max(fitting, default=0)


@dataclass(frozen=True)
class StepTimes:
    """Seconds of each timed training step (``seconds``) of a model with ``layers`` blocks."""

    layers: int
    seconds: tuple[float, ...]

    @property
    def median_s(self) -> float:
        """The median step (seconds)."""
        return statistics.median(self.seconds)


def _precision(device: torch.device, precision: str) -> tuple[Any, torch.dtype | None]:
    """The autocast context of ``precision`` on ``device`` and its 16-bit dtype (``None`` in fp32,
    tf32): ``amp`` is bf16 autocast, fp16 where the GPU has no bf16 (a V100)."""
    if precision != "amp":
        return torch.autocast(device.type, enabled=False), None
    dtype = torch.bfloat16 if device.type == "cpu" or torch.cuda.is_bf16_supported() else torch.float16
    return torch.autocast(device.type, dtype=dtype), dtype


def time_step(config: Config, device: torch.device, layers: int, batch_size: int, tokens: int, precision: str,
              warmup: int, repeats: int, seed: int = 0, progress: Callable[[str], None] | None = None) -> StepTimes:
    """Time ``repeats`` training steps of ``config`` with ``layers`` blocks on ``device`` after
    ``warmup`` untimed ones: ``batch_size`` sequences of ``tokens`` seeded random tokens, forward
    in ``precision`` (:func:`_precision`; ``tf32`` turns on TF32 matmuls on a GPU), cross-entropy
    on the next token in fp32, backward, AdamW. Each step between two synchronisations of
    ``device`` (wall clock)."""
    model = build(config, device, layers, seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator(device=device).manual_seed(seed)
    batch = torch.randint(0, config.vocab, (batch_size, tokens + 1), device=device, generator=generator)
    inputs, targets = batch[:, :-1], batch[:, 1:]
    autocast, half = _precision(device, precision)
    scaler = torch.amp.GradScaler(device.type) if half is torch.float16 else None
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = model(inputs)
        loss = F.cross_entropy(logits.float().view(-1, config.vocab), targets.reshape(-1))
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        seconds = []
        for i in range(warmup + repeats):
            if progress:
                progress(f"{layers} layers, step {i + 1} of {warmup + repeats}" + (" (warm-up)" if i < warmup else ""))
            elapsed, _ = timed(step, time.perf_counter, sync)
            if i >= warmup:
                seconds.append(elapsed)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        del model, optimizer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return StepTimes(layers, tuple(seconds))


@dataclass(frozen=True)
class StepMeasurement:
    """A training step of the whole model, measured or scaled up: ``step_s`` (median seconds of
    a step at full depth), ``low_s``/``high_s`` (the fastest and slowest timed step, scaled alike),
    ``timed`` (the runs: the whole model, or the model without blocks and with ``layers_timed``
    of them), ``scale`` (full depth ÷ ``layers_timed``; 1 when the whole model ran), all
    seconds (:func:`scaled`)."""

    step_s: float
    low_s: float
    high_s: float
    layers_timed: int
    scale: float
    timed: tuple[StepTimes, ...]


def scaled(runs: tuple[StepTimes, ...], depth: int) -> StepMeasurement:
    """The full-depth step of ``runs``: the one run when it holds all ``depth`` blocks, else the
    run without blocks (t₀) and the one with k: ``t₀ + depth/k · (t_k − t₀)`` of their medians,
    its fastest and slowest step in the proportion of the k-block run's to its median (so that
    they bracket it whatever the noise of the difference)."""
    part = runs[-1]
    if len(runs) == 1:
        return StepMeasurement(part.median_s, min(part.seconds), max(part.seconds), part.layers, 1.0, runs)
    scale = depth / part.layers
    step = runs[0].median_s + scale * (part.median_s - runs[0].median_s)
    return StepMeasurement(step, step * min(part.seconds) / part.median_s, step * max(part.seconds) / part.median_s,
                           part.layers, scale, runs)


def measure(config: Config, device: torch.device, batch_size: int, tokens: int, precision: str, *,
            warmup: int, repeats: int, layers: int | None = None,
            progress: Callable[[str], None] | None = None) -> StepMeasurement:
    """The training step of the whole of ``config`` on ``device``: timed whole when ``layers``
    (``None``: :func:`plan_layers` on the device's free memory, halved while a step runs out of
    memory) is its depth, else timed without blocks and with ``layers`` of them and scaled up
    (:func:`scaled`). ValueError (one line) when not even the embeddings, the head and one block
    fit."""
    from machine.device import available_memory

    k = plan_layers(config, batch_size, tokens, precision, available_memory(device)) if layers is None else layers
    if not 1 <= k <= config.layers:
        need = step_bytes(config, 1, batch_size, tokens, precision)
        raise ValueError(f"one block of this model at batch {batch_size} and {tokens} tokens needs "
                         f"~{need / 2**30:,.1f} GiB with its embeddings and head (weights, gradients, AdamW states, "
                         f"activations), more than {device} has free: lower --batch-size or --tokens")
    while True:
        try:
            runs = (time_step(config, device, k, batch_size, tokens, precision, warmup, repeats, progress=progress),)
            break
        except torch.OutOfMemoryError:
            if layers is not None or k == 1:
                raise ValueError(f"a step of {k} of the model's {config.layers} layers at batch {batch_size} and "
                                 f"{tokens} tokens ran out of memory on {device}: give fewer --layers, or lower "
                                 "--batch-size or --tokens") from None
            k //= 2  # the estimate (step_bytes) was short: half as many layers
    if k < config.layers:
        runs = (time_step(config, device, 0, batch_size, tokens, precision, warmup, repeats, progress=progress), *runs)
    result = scaled(runs, config.layers)
    if not result.step_s > 0 or not math.isfinite(result.step_s):
        raise ValueError(f"the step scaled from {k} of {config.layers} layers is {result.step_s:.3g} s: the layers' "
                         "share is lost in the noise; time more layers (--layers) or more steps (--repeats)")
    return result
