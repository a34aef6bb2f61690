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
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

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
    """Names of the available layouts."""
    return list(INPUTS)


def key(name: str, tokens: int | None) -> str:
    """The shipped file's key of ``name`` at ``tokens`` tokens: ``bert-base`` (its stated input)
    or ``bert-large@384``."""
    return name if tokens is None or tokens == TOKENS.get(name) else f"{name}@{tokens}"


def max_tokens(name: str) -> int:
    """The most tokens a sample of transformer layout ``name`` holds: its position embeddings
    (512 for BERT, 1024 for GPT-2)."""
    return 1024 if name == "gpt2" else 512


def check_tokens(name: str, tokens: int | None) -> int | None:
    """``tokens`` if layout ``name`` is a transformer and it is a whole number in [1,
    :func:`max_tokens`] (``None`` stays ``None``: the stated input); ValueError (one line) otherwise."""
    if tokens is None:
        return None
    if name not in TOKENS:
        raise ValueError(f"layout {name!r} takes no sequence length (--tokens is for {', '.join(TOKENS)})")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= max_tokens(name):
        raise ValueError(f"--tokens must be a whole number from 1 to {max_tokens(name)} for {name}, got {tokens!r}")
    return tokens


def layout(name: str, tokens: int | None = None) -> list[dict[str, Any]]:
    """Parameter layout of ``name`` with per-sample forward FLOPs (see the module docstring);
    ``tokens``: the sequence length of a transformer layout's sample instead of :data:`TOKENS`
    (at most :func:`max_tokens`). Read once per process, a fresh list each call."""
    if name not in INPUTS:
        raise ValueError(f"unknown layout {name!r}; choose one of {', '.join(INPUTS)}")
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
