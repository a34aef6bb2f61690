"""Random-k: ``k`` uniformly random distinct indices, seedable so workers can share them."""

from __future__ import annotations

import torch

from compressors.work import randomk as randomk_work
from compressors._validate import raise_if_not_finite, target_count
from compressors.base import Compressor
from compressors.messages.sparse import Sparse


class RandomK(Compressor):
    """Random-k: ``k = max(1, round(density * n))`` distinct indices drawn uniformly.

    ``seed``: with the same seed, workers that make the same sequence of calls draw identical
    indices (the generator advances once per call), so their values can be all-reduced and
    only values travel (``Sparse.shared_indices``; ``wire_bytes`` counts values only). Without a
    seed the draw comes from a fresh nondeterministic generator per compressor and indices travel.
    """

    name = "randomk"

    def __init__(self, density: float, seed: int | None = None):
        super().__init__(density)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be an int or None, got {seed!r}")
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}
        self._reseeded: int | None = None

    def reseed(self, seed: int) -> None:
        """Draw the following indices from generators seeded with ``seed``. With a constructor
        ``seed`` (indices shared by all workers, already deterministic) this does nothing, so
        workers keep drawing the same indices."""
        if self.seed is not None:
            return
        for gen in self._generators.values():
            gen.manual_seed(seed)
        self._reseeded = seed

    def _generator(self, device: torch.device) -> torch.Generator:
        gen = self._generators.get(device)
        if gen is None:
            gen = torch.Generator(device=device)
            seed = self.seed if self._reseeded is None else self._reseeded
            if seed is None:
                gen.seed()
            else:
                gen.manual_seed(seed)
            self._generators[device] = gen
        return gen

    def _draw(self, n: int, k: int, device: torch.device) -> torch.Tensor:
        gen = self._generator(device)
        if 4 * k >= n:
            return torch.sort(torch.randperm(n, generator=gen, device=device)[:k]).values
        chosen = torch.empty(0, dtype=torch.int64, device=device)
        while chosen.numel() < k:
            extra = k - chosen.numel()
            draw = torch.randint(n, (extra + extra // 16 + 16,), generator=gen, device=device)
            chosen = torch.unique(torch.cat((chosen, draw)))
        if chosen.numel() > k:
            keep = torch.randperm(chosen.numel(), generator=gen, device=device)[:k]
            chosen = torch.sort(chosen[keep]).values
        return chosen

    def _compress(self, grad: torch.Tensor) -> Sparse:
        n = grad.numel()
        indices = self._draw(n, target_count(self.density, n), grad.device)
        raise_if_not_finite(grad, grad.sum(dtype=torch.float32 if grad.dtype != torch.float64 else None))
        return Sparse(grad.index_select(0, indices), indices, n, shared_indices=self.seed is not None)

    work = staticmethod(randomk_work.randomk)
