"""Layer layouts of full-size models, measured on the meta device and shipped as data (no download).

:func:`layout` returns, in parameter (= gradient flattening) order, one dict per
parameter tensor: ``name``, ``shape`` (tuple), ``numel``, ``forward_flops``. FLOPs
count multiply and add as two operations and are **per sample** of the model's
stated input (:data:`INPUTS`): one 3×224×224 image for the CNNs, one sequence
of 128 tokens for bert-base and bert-large and of 1024 tokens for gpt2 (``tokens``
changes the sequence length, e.g. to the 384 of SQuAD fine-tuning). A weight carries its
layer's matrix or convolution FLOPs (attention score and mixing matmuls are
carried by the attention output projection); a bias or norm parameter carries
its element-wise FLOPs. Backward costs about twice the forward (the simulator
applies its own compute model: time = FLOPs × batch size ÷ device FLOP/s).

The layouts are measured on the meta device by :mod:`traces.layout_models` (PyTorch modules,
forward hooks) and shipped as ``traces/layouts.json`` (each layout at its stated input and at the
sequence lengths of the published throughput table), so projecting a layout never loads torch;
another sequence length is measured on first use (with torch). A test measures them again.

A decoder-only transformer given by its Hugging Face config.json (:mod:`traces.llm`: a shipped
model's name such as ``llama-3.1-8b``, or a config file's path) is a layout too, computed from its
config without torch: every function here takes it where it takes a layout's name, its stated
input :func:`traces.llm.stated` tokens, its longest its ``max_position_embeddings``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from traces import llm

INPUTS: dict[str, str] = {
    "resnet50": "one 3x224x224 image",
    "vgg16": "one 3x224x224 image",
    "vgg19": "one 3x224x224 image",
    "bert-base": "one sequence of 128 tokens",
    "bert-large": "one sequence of 128 tokens",
    "gpt2": "one sequence of 1024 tokens",
}

TOKENS: dict[str, int] = {"bert-base": 128, "bert-large": 128, "gpt2": 1024}
"""Sequence length of each transformer layout's stated input (:func:`layout` can change it)."""

SHIPPED = Path(__file__).with_name("layouts.json")
"""The measured layouts (:func:`traces.layout_models.write`)."""


def names() -> list[str]:
    """Names of the available measured layouts (models: :func:`traces.llm.names`)."""
    return list(INPUTS)


def stated_tokens(name: str) -> int | None:
    """Tokens per sample of layout or model ``name`` unless told (``None`` for a layout that takes no tokens)."""
    return TOKENS.get(name) if name in INPUTS else llm.stated(name)


def flag(name: str) -> str:
    """The command-line option that names ``name``: ``--layout resnet50`` or ``--model llama-3.1-8b``."""
    return f"--layout {name}" if name in INPUTS else f"--model {name}"


def key(name: str, tokens: int | None) -> str:
    """The shipped file's key of ``name`` at ``tokens`` tokens: ``bert-base`` (its stated input)
    or ``bert-large@384``."""
    return name if tokens is None or tokens == TOKENS.get(name) else f"{name}@{tokens}"


def max_tokens(name: str) -> int:
    """The most tokens a sample of transformer layout ``name`` holds: its position embeddings
    (512 for BERT, 1024 for GPT-2; a model's ``max_position_embeddings``)."""
    if name not in INPUTS:
        return llm.max_tokens(name)
    return 1024 if name == "gpt2" else 512


def check_tokens(name: str, tokens: int | None) -> int | None:
    """``tokens`` if layout ``name`` is a transformer and it is a whole number in [1,
    :func:`max_tokens`] (``None`` stays ``None``: the stated input); ValueError (one line) otherwise."""
    if tokens is None:
        return None
    if name not in INPUTS:
        return llm.tokens_of(name, tokens)
    if name not in TOKENS:
        raise ValueError(f"layout {name!r} takes no sequence length (--tokens is for {', '.join(TOKENS)})")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= max_tokens(name):
        raise ValueError(f"--tokens must be a whole number from 1 to {max_tokens(name)} for {name}, got {tokens!r}")
    return tokens


def layout(name: str, tokens: int | None = None) -> list[dict[str, Any]]:
    """Parameter layout of ``name`` with per-sample forward FLOPs (see the module docstring);
    ``tokens``: the sequence length of a transformer layout's sample instead of :data:`TOKENS`
    (at most :func:`max_tokens`); a model (:mod:`traces.llm`) from its config. Read once per
    process, a fresh list each call."""
    if name not in INPUTS:
        if llm.is_model(name):
            return llm.layout(name, tokens)
        raise ValueError(f"unknown layout {name!r}; choose one of {', '.join(INPUTS)} (or a model: "
                         f"{', '.join(llm.names())})")
    return [dict(entry) for entry in _layout(key(name, check_tokens(name, tokens)))]


@functools.lru_cache(maxsize=1)
def _shipped() -> dict[str, list[dict[str, Any]]]:
    return json.loads(SHIPPED.read_text())


@functools.lru_cache(maxsize=32)
def _layout(wanted: str) -> tuple[dict[str, Any], ...]:
    rows = _shipped().get(wanted)
    if rows is None:  # a sequence length not shipped: measured now (imports torch)
        from traces import layout_models

        name, _, tokens = wanted.partition("@")
        rows = layout_models.measure(name, int(tokens))
    return tuple({**row, "shape": tuple(row["shape"])} for row in rows)
