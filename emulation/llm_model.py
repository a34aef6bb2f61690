"""The decoder-only transformer of a :class:`traces.llm.Config` (:func:`traces.workloads.llm.build`,
random weights) as the emulation trains it: its forward returns the loss, its blocks are listed.

Its ``named_parameters()`` are exactly the tensors :func:`traces.llm.tensors` lists for the same
config (names, shapes, order; a tied LM head is the token embedding). A Mixtral-style MoE model is
not trained here (ValueError). :attr:`Transformer.blocks` are the transformer blocks, the units FSDP2
shards one by one. The forward of a batch of token ids (batch, tokens + 1) returns the mean
next-token cross-entropy loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from traces.llm import Config
from traces.workloads.llm import CausalLM, build as build_causal_lm


class Transformer(CausalLM):
    """:class:`traces.workloads.llm.CausalLM` with the emulation's loss and its :attr:`blocks`."""

    @property
    def blocks(self) -> list[nn.Module]:
        """The transformer blocks in order."""
        return list(self.transformer.h if hasattr(self, "transformer") else self.model.layers)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of predicting each next token of ``tokens`` (batch, length; ids)."""
        logits = super().forward(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def build(config: Config, seed: int = 0) -> Transformer:
    """The model of ``config`` with random weights drawn from ``seed`` (the same on every rank)."""
    if config.experts:
        raise ValueError("a mixture-of-experts model is not built in the emulation: choose a dense model")
    return build_causal_lm(config, seed=seed, model_class=Transformer)


def tokens(config: Config, batch: int, length: int, seed: int) -> torch.Tensor:
    """A batch of ``batch`` synthetic sequences of ``length`` + 1 token ids (uniform over the vocabulary)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab, (batch, length + 1), generator=generator)


def parameter_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters (each tensor's numel × element size)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())
