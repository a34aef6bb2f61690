"""A decoder-only transformer's Hugging Face ``config.json``, read and checked (no torch, no download).

:func:`parse` turns the JSON object of a GPT-2, LLaMA, Mistral, Qwen2 or Mixtral configuration into a
:class:`Config` of the numbers that fix its parameter tensors and FLOPs, under the field names and
defaults of the family's ``transformers`` configuration class (``GPT2Config``, ``LlamaConfig``,
``MistralConfig``, ``Qwen2Config``, ``MixtralConfig``). Every rule breaks with one line naming the
field (:class:`ConfigError`, a ValueError): a missing or non-numeric field, heads that do not divide
the hidden size, key-value heads that do not divide the heads, zero layers, sizes beyond
:data:`LIMITS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "mixtral")
"""The ``model_type`` values read: GPT-2's naming, or the LLaMA naming the others share."""

LIMITS: dict[str, int] = {
    "hidden_size": 1 << 16,
    "num_hidden_layers": 1024,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "head_dim": 1 << 12,
    "intermediate_size": 1 << 20,
    "vocab_size": 1 << 22,
    "max_position_embeddings": 1 << 22,
    "num_local_experts": 1024,
    "num_experts_per_tok": 1024,
}
"""The largest value each field may take (published models stay far below: Llama-3.1-405B has a
hidden size of 16,384, 126 layers and a vocabulary of 128,256); larger is taken for a mistake."""

MAX_PARAMETERS = 10**13
"""The most parameters a configuration may describe (10 trillion)."""


class ConfigError(ValueError):
    """A configuration that cannot describe a model; the message is one line naming the field."""


@dataclass(frozen=True)
class Config:
    """What fixes a decoder-only transformer's tensors: ``family`` (:data:`FAMILIES`), ``hidden``
    (model width), ``layers``, ``heads`` and ``kv_heads`` (query and key-value heads), ``head_dim``,
    ``ffn`` (MLP width: ``intermediate_size``, GPT-2's ``n_inner``), ``vocab``, ``positions`` (the
    longest sequence, in tokens), ``tied`` (the LM head shares the token embedding), ``qkv_bias``,
    ``o_bias``, ``mlp_bias`` (biases on those projections), ``experts`` (MoE experts per layer, 0
    for a dense MLP) and ``experts_per_token`` (experts each token is routed to)."""

    family: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    positions: int
    tied: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    experts: int = 0
    experts_per_token: int = 0


def _whole(raw: Mapping[str, Any], field: str, default: Any = None, *, where: str) -> int:
    """Field ``field`` of ``raw`` as a whole number in [1, :data:`LIMITS`] (``default`` when absent
    or ``null``, as ``transformers`` reads it, and not ``None``); ConfigError naming it otherwise."""
    value = raw.get(field)
    if value is None:
        value = default
    if value is None:
        raise ConfigError(f"{where}: field {field!r} is missing")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
        raise ConfigError(f"{where}: field {field!r} must be a whole number, got {value!r}")
    limit = LIMITS.get(field, LIMITS["hidden_size"])
    if not 1 <= value <= limit:
        raise ConfigError(f"{where}: field {field!r} must be from 1 to {limit}, got {value!r}")
    return int(value)


def _flag(raw: Mapping[str, Any], field: str, default: bool, *, where: str) -> bool:
    """Boolean field ``field`` of ``raw`` (``default`` when absent); ConfigError otherwise."""
    value = raw.get(field, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: field {field!r} must be true or false, got {value!r}")
    return value


def parse(raw: Any, where: str = "config") -> Config:
    """The :class:`Config` of ``raw`` (a config.json's object; ``where`` names it in errors)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: a config.json holds a JSON object, got {type(raw).__name__}")
    family = raw.get("model_type")
    if family not in FAMILIES:
        raise ConfigError(f"{where}: field 'model_type' must be one of {', '.join(FAMILIES)}, got {family!r}")
    if family == "gpt2":
        hidden = _whole(raw, "n_embd", where=where)
        heads = _whole(raw, "n_head", where=where)
        layers = _whole(raw, "n_layer", where=where)
        ffn = _whole(raw, "n_inner", 4 * hidden, where=where)
        if hidden % heads:
            raise ConfigError(f"{where}: field 'n_head' ({heads}) must divide 'n_embd' ({hidden})")
        config = Config(family, hidden, layers, heads, heads, hidden // heads, ffn, _whole(raw, "vocab_size", where=where),
                        _whole(raw, "n_positions", where=where), _flag(raw, "tie_word_embeddings", True, where=where),
                        qkv_bias=True, o_bias=True, mlp_bias=True)
    else:
        hidden = _whole(raw, "hidden_size", where=where)
        heads = _whole(raw, "num_attention_heads", where=where)
        kv_heads = _whole(raw, "num_key_value_heads", heads, where=where)
        if raw.get("head_dim") is not None:
            head_dim = _whole(raw, "head_dim", where=where)
        elif hidden % heads:
            raise ConfigError(f"{where}: field 'num_attention_heads' ({heads}) must divide 'hidden_size' ({hidden})")
        else:
            head_dim = hidden // heads
        if heads % kv_heads:
            raise ConfigError(f"{where}: field 'num_key_value_heads' ({kv_heads}) must divide "
                              f"'num_attention_heads' ({heads})")
        attention_bias = family != "qwen2" and _flag(raw, "attention_bias", False, where=where)
        experts = experts_per_token = 0
        if family == "mixtral" or raw.get("num_local_experts") is not None:
            experts = _whole(raw, "num_local_experts", where=where)
            experts_per_token = _whole(raw, "num_experts_per_tok", where=where)
            if experts_per_token > experts:
                raise ConfigError(f"{where}: field 'num_experts_per_tok' ({experts_per_token}) must be at most "
                                  f"'num_local_experts' ({experts})")
        config = Config(family, hidden, _whole(raw, "num_hidden_layers", where=where), heads, kv_heads, head_dim,
                        _whole(raw, "intermediate_size", where=where), _whole(raw, "vocab_size", where=where),
                        _whole(raw, "max_position_embeddings", where=where),
                        _flag(raw, "tie_word_embeddings", False, where=where),
                        qkv_bias=family == "qwen2" or attention_bias, o_bias=attention_bias,
                        mlp_bias=family == "llama" and _flag(raw, "mlp_bias", False, where=where),
                        experts=experts, experts_per_token=experts_per_token)
    from traces.llm.params import parameter_count

    total = parameter_count(config)
    if total > MAX_PARAMETERS:
        raise ConfigError(f"{where}: describes {total:.3g} parameters, more than {MAX_PARAMETERS:.0e}: "
                          "check 'num_hidden_layers' and the sizes")
    return config


def stated_tokens(config: Config, default: int) -> int:
    """The sequence length (tokens) a sample of ``config`` holds unless told: ``default``, at most
    its longest sequence."""
    return min(default, config.positions)


def check_tokens(config: Config, tokens: Any, name: str) -> int:
    """``tokens`` if a whole number in [1, the model's longest sequence]; ValueError (one line) otherwise."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= config.positions:
        raise ValueError(f"--tokens must be a whole number from 1 to {config.positions} for {name}, got {tokens!r}")
    return tokens

