"""The full-size models behind :mod:`traces.layouts`, built on the meta device (no memory, no
download), and the measurement of their layouts: :func:`measure` counts each parameter's
per-sample forward FLOPs with forward hooks; :func:`write` regenerates the shipped
``traces/layouts.json`` (``python -m traces.layout_models``), which a test keeps equal to it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from traces.layouts import INPUTS, SHIPPED, TOKENS, key


class Bottleneck(nn.Module):
    """ResNet-50 bottleneck block (1×1, 3×3, 1×1 convolutions, expansion 4)."""

    def __init__(self, c_in: int, planes: int, stride: int) -> None:
        super().__init__()
        c_out = planes * 4
        self.conv1 = nn.Conv2d(c_in, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, c_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c_out)
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = torch.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return torch.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet50(nn.Module):
    """ResNet-50 for ImageNet (25.6 M parameters), torchvision parameter naming."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        c_in = 64
        for index, (planes, blocks, stride) in enumerate(((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))):
            stage = []
            for block in range(blocks):
                stage.append(Bottleneck(c_in, planes, stride if block == 0 else 1))
                c_in = planes * 4
            setattr(self, f"layer{index + 1}", nn.Sequential(*stage))
        self.fc = nn.Linear(2048, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class VGG19(nn.Module):
    """VGG-19 for ImageNet (143.7 M parameters), torchvision parameter naming."""

    CONFIG = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M")

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 3
        for item in self.CONFIG:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(c_in, int(item), 3, padding=1), nn.ReLU(inplace=True)]
                c_in = int(item)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Linear(4096, 4096), nn.ReLU(True), nn.Linear(4096, 1000)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class VGG16(VGG19):
    """VGG-16 for ImageNet (138.4 M parameters), torchvision parameter naming."""

    CONFIG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


class Attention(nn.Module):
    """Multi-head self-attention (separate or fused QKV); ``proj`` carries the score FLOPs."""

    def __init__(self, dim: int, heads: int, fused: bool) -> None:
        super().__init__()
        self.heads = heads
        self.fused = fused
        if fused:
            self.qkv = nn.Linear(dim, 3 * dim)
        else:
            self.query, self.key, self.value = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        if self.fused:
            q, k, v = self.qkv(x).split(d, dim=-1)
        else:
            q, k, v = self.query(x), self.key(x), self.value(x)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        out = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, s, d))


class Block(nn.Module):
    """Transformer block: post-norm (BERT) or pre-norm (GPT-2), 4× GELU MLP."""

    def __init__(self, dim: int, heads: int, pre_norm: bool) -> None:
        super().__init__()
        self.pre_norm = pre_norm
        self.attn = Attention(dim, heads, fused=pre_norm)
        self.ln1 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.ln2 = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attn(self.ln1(x))
            return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.fc2(nn.functional.gelu(self.fc1(x))))


class Transformer(nn.Module):
    """BERT encoder (with pooler) or GPT-2 small decoder (tied head); default 12 layers of 768
    (BERT-base, GPT-2 small), BERT-large: 24 layers of 1024, 16 heads."""

    def __init__(self, vocab: int, context: int, gpt: bool, dim: int = 768, layers: int = 12, heads: int = 12) -> None:
        super().__init__()
        self.gpt = gpt
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(context, dim)
        if not gpt:
            self.token_types = nn.Embedding(2, dim)
            self.ln_emb = nn.LayerNorm(dim)
        self.blocks = nn.ModuleList(Block(dim, heads, pre_norm=gpt) for _ in range(layers))
        if gpt:
            self.ln_f = nn.LayerNorm(dim)
        else:
            self.pooler = nn.Linear(dim, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.tokens(ids) + self.positions(positions)
        if not self.gpt:
            x = self.ln_emb(x + self.token_types(torch.zeros_like(ids)))
        for block in self.blocks:
            x = block(x)
        if self.gpt:
            return self.ln_f(x) @ self.tokens.weight.t()
        return torch.tanh(self.pooler(x[:, 0]))


def _count(shape: torch.Size) -> int:
    return math.prod(shape)


def _module_flops(module: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> dict[str, float]:
    """FLOPs per direct parameter of ``module`` for one forward call (batch of 1)."""
    out = _count(output.shape)
    if isinstance(module, nn.Conv2d):
        kernel = module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
        flops = {"weight": 2.0 * kernel * out}
        if module.bias is not None:
            flops["bias"] = float(out)
        return flops
    if isinstance(module, nn.Linear):
        flops = {"weight": 2.0 * module.in_features * out}
        if module.bias is not None:
            flops["bias"] = float(out)
        return flops
    if isinstance(module, (nn.BatchNorm2d, nn.LayerNorm)):
        return {"weight": 4.0 * out, "bias": 1.0 * out}  # normalise (≈3/elem) + scale; shift
    if isinstance(module, nn.Embedding):
        return {"weight": float(out)}
    if isinstance(module, Attention):
        _, seq, dim = inputs[0].shape
        return {"proj.weight": 4.0 * seq * seq * dim}
    if isinstance(module, Transformer) and module.gpt:
        return {"tokens.weight": 2.0 * module.tokens.embedding_dim * out}
    return {}


def _build(name: str, tokens: int | None = None) -> tuple[nn.Module, torch.Tensor]:
    if name == "resnet50":
        return ResNet50(), torch.empty(1, 3, 224, 224, device="meta")
    if name in ("vgg16", "vgg19"):
        return (VGG16() if name == "vgg16" else VGG19()), torch.empty(1, 3, 224, 224, device="meta")
    ids = torch.zeros(1, tokens or TOKENS[name], dtype=torch.int64, device="meta")
    if name == "bert-base":
        return Transformer(30522, 512, gpt=False), ids
    if name == "bert-large":
        return Transformer(30522, 512, gpt=False, dim=1024, layers=24, heads=16), ids
    return Transformer(50257, 1024, gpt=True), ids


def measure(name: str, tokens: int | None = None) -> list[dict[str, Any]]:
    """Parameter layout of ``name`` (with ``tokens`` tokens per sample for a transformer layout,
    default :data:`traces.layouts.TOKENS`) and per-sample forward FLOPs, measured on the meta
    device (the rules: :mod:`traces.layouts`)."""
    with torch.device("meta"):
        model, example = _build(name, tokens)
    owner = {id(p): n for n, p in model.named_parameters()}
    flops: dict[str, float] = {n: 0.0 for n in owner.values()}
    hooks: list[Callable[[], None]] = []
    for module in model.modules():
        def hook(mod: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
            for local, value in _module_flops(mod, inputs, output).items():
                param = mod.get_parameter(local)
                flops[owner[id(param)]] += value
        hooks.append(module.register_forward_hook(hook).remove)
    with torch.no_grad():
        model(example)
    for remove in hooks:
        remove()
    return [
        {"name": n, "shape": tuple(p.shape), "numel": p.numel(), "forward_flops": flops[n]}
        for n, p in model.named_parameters()
    ]


def shipped_keys() -> list[tuple[str, int | None]]:
    """What ``traces/layouts.json`` holds: every layout at its stated input, and each
    (transformer layout, sequence length) the published throughput table uses."""
    import profiles

    table = json.loads(profiles.THROUGHPUT.read_text())
    extra = sorted({(row["layout"], int(row["tokens"])) for row in table["rows"]
                    if row.get("tokens") is not None and int(row["tokens"]) != TOKENS.get(row["layout"])})
    return [(name, None) for name in INPUTS] + extra


def write(path: Path = SHIPPED) -> Path:
    """Measure every layout of :func:`shipped_keys` and write them as JSON to ``path``
    (default: the shipped file)."""
    data = {key(name, tokens): [{**row, "shape": list(row["shape"])} for row in measure(name, tokens)]
            for name, tokens in shipped_keys()}
    path.write_text(json.dumps(data, indent=0, sort_keys=True) + "\n")
    return path


if __name__ == "__main__":
    print(write())
