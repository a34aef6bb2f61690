"""Real English text offline: the CPython documentation every Python ships, or a user's UTF-8 file.

Corpus (:func:`pydoc_texts`): ``pydoc_data.topics.topics``, the help topics of the running
Python's reference documentation (79 topics, about 465 kB of English prose and code samples
in CPython 3.11). Split by topic, so no held-out text is trained on: going through the topics
sorted by name, a topic is held out when the held-out part with it stays within
:data:`HELDOUT_FRACTION` of the characters seen so far (just under 10 % of the text ends up
held out, in whole topics).

A text file (:func:`file_texts`): UTF-8, split by lines: the last :data:`HELDOUT_FRACTION` of
its lines held out.

Tokenisation (:func:`tokenize`): lower-cased; a token is a run of letters ``[a-z]``, a run of
digits, or any other single non-space character (punctuation, brackets, operators), so
``"x = f(10)."`` is ``x = f ( 10 ) .``. Vocabulary: the ``vocab - 1`` most frequent tokens of
the training text (ties by token), id 0 is ``<unk>`` for every other token (held-out tokens
not in the vocabulary included).

Batches (:class:`TextCorpus`): the training token stream is cut into ``W`` contiguous shards;
batch ``b`` of worker ``w`` takes ``B`` windows of ``seq_len + 1`` tokens at offsets drawn
from a generator seeded by ``(seed, W, w, b)`` inside the worker's shard (inputs: the first
``seq_len``, targets: the last ``seq_len``, the next token of each). Held-out batches are
consecutive non-overlapping windows of the held-out stream, the same on every call.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import torch

from traces.files import read_regular
from traces.workloads.data import seeded_generator

HELDOUT_FRACTION = 0.1
"""About this fraction of the text is held out: whole pydoc topics, the last lines of a file."""
MAX_TEXT_BYTES = 256 * 1024 * 1024
"""Largest text file read (bytes)."""
_TOKEN = re.compile(r"[a-z]+|[0-9]+|[^\sa-z0-9]")


def tokenize(text: str) -> list[str]:
    """Tokens of ``text`` (module docstring: lower-cased letter runs, digit runs, single other characters)."""
    return _TOKEN.findall(text.lower())


def pydoc_texts() -> tuple[list[str], list[str]]:
    """``(train, heldout)`` topic texts of ``pydoc_data.topics`` (split by topic, module docstring)."""
    from pydoc_data.topics import topics

    train, held, seen, held_chars = [], [], 0, 0
    for name in sorted(topics):
        text = topics[name]
        seen += len(text)
        if held_chars + len(text) <= HELDOUT_FRACTION * seen:
            held.append(text)
            held_chars += len(text)
        else:
            train.append(text)
    return train, held


def file_texts(path: str | Path) -> tuple[list[str], list[str]]:
    """``(train, heldout)`` of a UTF-8 text file split by lines (the last :data:`HELDOUT_FRACTION`
    held out); ``ValueError`` (one line) for a missing, huge, non-UTF-8 or too short file."""
    path = Path(path)
    try:
        text = read_regular(path, MAX_TEXT_BYTES, "--data text file").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"--data {path}: not UTF-8 text (byte {exc.start})") from None
    lines = text.splitlines()
    cut = len(lines) - max(1, int(len(lines) * HELDOUT_FRACTION))
    if cut < 1:
        raise ValueError(f"--data {path}: needs at least 2 lines (the last {HELDOUT_FRACTION:.0%} are held out)")
    return ["\n".join(lines[:cut])], ["\n".join(lines[cut:])]


def vocabulary(tokens: Sequence[str], size: int) -> dict[str, int]:
    """Token -> id for the ``size - 1`` most frequent ``tokens`` (ties by token), ``<unk>`` = 0."""
    counts = Counter(tokens)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[: size - 1]
    return {"<unk>": 0, **{token: i + 1 for i, token in enumerate(ranked)}}


def encode(texts: Sequence[str], vocab: dict[str, int]) -> torch.Tensor:
    """The token ids (int64) of ``texts`` one after the other."""
    return torch.tensor([vocab.get(t, 0) for text in texts for t in tokenize(text)], dtype=torch.int64)


class TextCorpus:
    """Next-token batches (B, seq_len) int64 from a real text split into training and held-out parts."""

    def __init__(self, train: Sequence[str], heldout: Sequence[str], *, vocab: int = 2000, seq_len: int = 35,
                 seed: int = 0, name: str = "text") -> None:
        self.name = name
        self.seq_len = seq_len
        self.seed = seed
        train_tokens = [t for text in train for t in tokenize(text)]
        self.vocabulary = vocabulary(train_tokens, vocab)
        self.vocab = vocab
        self.train = torch.tensor([self.vocabulary.get(t, 0) for t in train_tokens], dtype=torch.int64)
        self.heldout = encode(heldout, self.vocabulary)
        for part, tokens in (("training", self.train), ("held-out", self.heldout)):
            if tokens.numel() < seq_len + 1:
                raise ValueError(f"{name}: its {part} part has {tokens.numel()} tokens, fewer than one "
                                 f"window of {seq_len + 1}")

    def batch(self, worker: int, workers: int, index: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch ``index`` of ``worker``'s shard: inputs and next-token targets, both (B, seq_len) int64."""
        window = self.seq_len + 1
        size = self.train.numel() // workers
        start = worker * size
        span = size - window + 1
        if size < window:  # a shard shorter than a window: windows from the whole stream
            start, span = 0, self.train.numel() - window + 1
        gen = seeded_generator(self.seed, workers, worker, index)
        offsets = start + torch.randint(0, span, (batch_size,), generator=gen)
        tokens = self.train[offsets.unsqueeze(1) + torch.arange(window)]
        return tokens[:, :-1], tokens[:, 1:]

    def heldout_batch(self, index: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Held-out batch ``index``: consecutive windows of the held-out stream (wrapping around)."""
        window = self.seq_len + 1
        count = (self.heldout.numel() - 1) // self.seq_len
        starts = (torch.arange(index * batch_size, (index + 1) * batch_size) % count) * self.seq_len
        tokens = self.heldout[starts.unsqueeze(1) + torch.arange(window)]
        return tokens[:, :-1], tokens[:, 1:]

    def unigram_loss(self) -> float:
        """Held-out cross-entropy (nats per token) of the training tokens' unigram distribution
        (counts + 1/2 each): the held-out loss of the best model that ignores context."""
        counts = torch.bincount(self.train, minlength=self.vocab).double() + 0.5
        log_p = (counts / counts.sum()).log()
        return float(-log_p[self.heldout].mean())
