"""Built-in workloads (seeded models, sharded offline data, learnability) and full-size layouts."""

from __future__ import annotations

import pytest
import torch

from traces import layouts, workloads


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("name", workloads.names())
def test_model_is_seeded_and_identical_on_every_rank(name: str) -> None:
    a = workloads.build(name, seed=3)
    b = workloads.build(name, seed=3)
    c = workloads.build(name, seed=4)
    pa, pb, pc = (torch.cat([p.detach().reshape(-1) for p in w.model.parameters()]) for w in (a, b, c))
    assert torch.equal(pa, pb)
    assert not torch.equal(pa, pc)
    assert torch.equal(torch.cat([p.detach().reshape(-1) for p in a.build_model().parameters()]), pa)


@pytest.mark.parametrize("name", workloads.names())
def test_shards_are_reproducible_and_disjoint(name: str) -> None:
    w = workloads.build(name)
    x0, y0 = next(w.batches(0, 4, batch_size=8))
    x0b, y0b = next(w.batches(0, 4, batch_size=8))
    x1, _ = next(w.batches(1, 4, batch_size=8))
    assert torch.equal(x0, x0b) and torch.equal(y0, y0b)
    assert not torch.equal(x0, x1)
    assert x0.shape[0] == 8
    out = w.model(x0)
    loss = w.loss(out, y0)
    assert loss.ndim == 0 and torch.isfinite(loss)


def test_image_and_text_shapes() -> None:
    x, y = next(workloads.build("resnet20").batches(0, 1, batch_size=2))
    assert x.shape == (2, 3, 32, 32) and y.shape == (2,) and int(y.max()) < 10
    x, y = next(workloads.build("lstm").batches(0, 1, batch_size=2))
    assert x.shape == (2, 35) and y.shape == (2, 35)
    assert torch.equal(x[:, 1:], y[:, :-1]), "targets are the next words"


def test_resnet20_has_the_published_size() -> None:
    model = workloads.build("resnet20", width=1.0).model
    assert sum(p.numel() for p in model.parameters()) == 272_474
    vgg = workloads.build("vgg16", width=1.0).model
    assert 14.7e6 < sum(p.numel() for p in vgg.parameters()) < 15.1e6


def test_images_are_learnable() -> None:
    """A linear classifier separates the class-conditional images well above chance (10 %)."""
    w = workloads.build("resnet20")
    classifier = torch.nn.Linear(3 * 32 * 32, 10)
    optimizer = torch.optim.SGD(classifier.parameters(), lr=0.01, momentum=0.9)
    shard = w.batches(0, 1, batch_size=64)
    for _ in range(40):
        x, y = next(shard)
        optimizer.zero_grad()
        w.loss(classifier(x.flatten(1)), y).backward()
        optimizer.step()
    x, y = next(w.batches(1, 2, batch_size=512))
    accuracy = float((classifier(x.flatten(1)).argmax(1) == y).float().mean())
    assert accuracy > 0.5


@pytest.mark.parametrize("name", ["transformer", "lstm"])
def test_text_is_learnable(name: str) -> None:
    w = workloads.build(name)
    optimizer = w.optimizer()
    shard = w.batches(0, 1)
    losses = []
    for _ in range(20):
        x, y = next(shard)
        optimizer.zero_grad()
        loss = w.loss(w.model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert sum(losses[-5:]) / 5 < 0.85 * sum(losses[:5]) / 5


def test_bad_workload_arguments() -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        workloads.build("alexnet")
    with pytest.raises(ValueError, match="width"):
        workloads.build("resnet20", width=0)
    with pytest.raises(ValueError, match="out of range"):
        next(workloads.build("resnet20").batches(4, 4))


@pytest.mark.parametrize(
    ("name", "params", "gflops"),
    [
        ("resnet50", 25_557_032, (8.1, 8.4)),  # 4.1 GMAC per 224x224 image
        ("vgg16", 138_357_544, (30.7, 31.2)),  # 15.5 GMAC
        ("vgg19", 143_667_240, (39.0, 39.6)),  # 19.6 GMAC
        ("bert-base", 109_482_240, (21.0, 23.5)),  # 128 tokens
        ("bert-large", 335_141_888, (78.0, 80.0)),  # 128 tokens: 2 x 302 M matrix weights x 128 + attention
        ("gpt2", 124_439_808, (280.0, 300.0)),  # 1024 tokens, tied head included
    ],
)
def test_layouts(name: str, params: int, gflops: tuple[float, float]) -> None:
    layers = layouts.layout(name)
    assert sum(layer["numel"] for layer in layers) == params
    total = sum(layer["forward_flops"] for layer in layers) / 1e9
    assert gflops[0] < total < gflops[1]
    assert all(layer["forward_flops"] >= 0 for layer in layers)
    assert len({layer["name"] for layer in layers}) == len(layers)
    assert all(layer["numel"] == torch.Size(layer["shape"]).numel() for layer in layers)


def test_layout_tokens_scale_matrices_linearly_and_attention_quadratically() -> None:
    """At 3x the tokens the matrix FLOPs triple and the attention scores (4·s²·d per layer, carried
    by the output projections) grow ninefold; a CNN layout takes no sequence length."""
    short, long = layouts.layout("bert-base"), layouts.layout("bert-base", tokens=384)
    scores = 12 * 4.0 * 128**2 * 768
    assert sum(e["forward_flops"] for e in long) == pytest.approx(
        3 * (sum(e["forward_flops"] for e in short) - scores) + 9 * scores, rel=1e-3)
    with pytest.raises(ValueError, match="no sequence length"):
        layouts.layout("resnet50", tokens=384)


def test_layout_order_is_parameter_order() -> None:
    layers = layouts.layout("resnet50")
    assert layers[0]["name"] == "conv1.weight" and layers[-1]["name"] == "fc.bias"
    with pytest.raises(ValueError, match="unknown layout"):
        layouts.layout("resnet18")
