"""The four built-in models in plain torch (no torchvision).

``width`` scales channel / hidden sizes (1.0 = the published size for ResNet-20
and VGG-16 on CIFAR-10).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def _scaled(channels: int, width: float) -> int:
    return max(4, int(round(channels * width)))


class BasicBlock(nn.Module):
    """ResNet basic block (two 3×3 convolutions with batch norm) with an option-B shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNetCifar(nn.Module):
    """ResNet-(6n+2) for 3×32×32 inputs (n=3: ResNet-20, 0.27 M parameters at width 1)."""

    def __init__(self, blocks_per_stage: int = 3, width: float = 1.0, classes: int = 10) -> None:
        super().__init__()
        channels = [_scaled(c, width) for c in (16, 32, 64)]
        self.conv1 = nn.Conv2d(3, channels[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels[0])
        layers = []
        c_in = channels[0]
        for stage, c_out in enumerate(channels):
            for block in range(blocks_per_stage):
                layers.append(BasicBlock(c_in, c_out, 2 if stage > 0 and block == 0 else 1))
                c_in = c_out
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(c_in, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(torch.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1))


VGG16_CONFIG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


class VGGCifar(nn.Module):
    """VGG-16 with batch norm for 3×32×32 inputs (14.7 M parameters at width 1)."""

    def __init__(self, width: float = 1.0, classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 3
        for item in VGG16_CONFIG:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                c_out = _scaled(int(item), width)
                layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
                c_in = c_out
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c_in, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class LSTMLanguageModel(nn.Module):
    """Two-layer word-level LSTM language model (embedding, LSTM, decoder), PTB-style."""

    def __init__(self, vocab: int = 2000, width: float = 1.0, layers: int = 2, dropout: float = 0.2) -> None:
        super().__init__()
        hidden = _scaled(200, width)
        self.embedding = nn.Embedding(vocab, hidden)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=layers, batch_first=True, dropout=dropout)
        self.drop = nn.Dropout(dropout)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.drop(self.embedding(tokens)))
        return self.decoder(self.drop(out))


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused QKV projection."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(b, s, d))


class DecoderBlock(nn.Module):
    """Pre-norm transformer decoder block (attention + 4× MLP with GELU)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


class GPTDecoder(nn.Module):
    """Small GPT-style decoder: token + learned position embeddings, blocks, tied output head."""

    def __init__(self, vocab: int = 2000, width: float = 1.0, layers: int = 2, heads: int = 4, context: int = 64) -> None:
        super().__init__()
        dim = heads * max(1, _scaled(32, width))
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(DecoderBlock(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        nn.init.normal_(self.tokens.weight, std=1.0 / math.sqrt(dim))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tokens(tokens) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.tokens.weight.t()
