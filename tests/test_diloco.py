"""DiLoCo for real (:mod:`convergence.diloco`): H = 1 with plain SGD inside and out is synchronous
SGD; one site with H > 1 is local training followed by the outer Nesterov step computed by hand;
the outer exchange compresses with error feedback and its messages' mean is what it applies."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import compressors
from convergence import RunConfig, train, train_diloco
from convergence.diloco import OuterExchange

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = RunConfig("transformer", workers=2, iterations=4, eval_every=2, width=0.125, batch_size=4, eval_samples=8,
                 data="synthetic", lr=0.05)


def _snapshots(rows_of, config, **kwargs) -> list[list[torch.Tensor]]:
    seen: list[list[torch.Tensor]] = []

    def observe(_: int, model: torch.nn.Module) -> None:
        seen.append([p.detach().clone() for p in model.parameters()])

    list(rows_of(config, observe=observe, **kwargs))
    return seen


def _sgd(params):
    return torch.optim.SGD(params, lr=0.05)


def test_h1_with_plain_sgd_inside_and_out_is_synchronous_sgd():
    # Inner SGD without momentum, outer SGD at learning rate 1 without momentum, H = 1: the outer
    # step applies θ − mean_w(θ − (θ − η g_w)) = θ − η·mean_w g_w, synchronous SGD's step. Equal up
    # to fp32 rounding, not bit for bit: the pseudo-gradient θ − (θ − η g) is η g only up to the
    # rounding of the two subtractions (half an ulp of |θ| each), so the test allows a few ulps of
    # the largest parameter per step taken.
    sync = _snapshots(train, TINY, optimizer=_sgd, compressor="none", density=None)
    diloco = _snapshots(train_diloco, replace(TINY, outer_lr=1.0, outer_momentum=0.0), optimizer=_sgd)
    assert len(sync) == len(diloco) == TINY.iterations
    eps = torch.finfo(torch.float32).eps
    for step, (a, b) in enumerate(zip(sync, diloco), start=1):
        scale = max(float(t.abs().max()) for t in a)
        worst = max(float((x - y).abs().max()) for x, y in zip(a, b))
        assert worst <= 4 * step * eps * scale, f"step {step}: {worst:.3g} apart (scale {scale:.3g})"
    assert any(not torch.equal(x, y) for x, y in zip(sync[0], sync[-1])), "the parameters must have moved"


def test_one_site_h4_is_local_training_then_the_outer_nesterov_step_by_hand():
    config = replace(TINY, workers=1, iterations=8, eval_every=4, sync_every=4, optimizer="adamw", lr=1e-3)
    diloco = _snapshots(train_diloco, config)
    # by hand: the same site alone, AdamW for 4 steps from θ, then with Δ = θ − θ_site:
    # b ← Δ (first outer step) or μ·b + Δ, θ ← θ − lr·(Δ + μ·b) (Nesterov), in the order of
    # operations torch's SGD uses, so the parameters agree bit for bit: AdamW, whose update is
    # about ±lr wherever a gradient is tiny, would turn any rounding difference in θ into a
    # visible one by the next outer step.
    work = config.build()
    site = work.model
    params = list(site.parameters())
    inner = config.make_optimizer(params, work.lr)
    shard = work.batches(0, 1)
    theta = [p.detach().clone() for p in params]
    buf = [torch.zeros_like(p) for p in params]
    lr, mu = config.outer_lr, config.outer_momentum
    for outer_step in range(2):
        for _ in range(4):
            inputs, targets = next(shard)
            inner.zero_grad(set_to_none=True)
            work.loss(site(inputs), targets).backward()
            inner.step()
        with torch.no_grad():
            for i, p in enumerate(params):
                delta = theta[i] - p
                buf[i] = delta.clone() if outer_step == 0 else buf[i].mul_(mu).add_(delta)
                theta[i] = theta[i].add(delta.add(buf[i], alpha=mu), alpha=-lr)
                p.copy_(theta[i])
        for by_hand, trained in zip(theta, diloco[4 * outer_step + 3]):
            assert torch.equal(trained, by_hand)


def test_outer_exchange_compresses_with_error_feedback_and_averages_the_messages():
    deltas = [torch.randn(1000, generator=torch.Generator().manual_seed(s)) for s in range(2)]
    exchange = OuterExchange("topk", 0.01, 2, [(1000,)])
    first = exchange.average(deltas)
    reference = [compressors.create("topk", density=0.01) for _ in range(2)]
    expected = sum(c.decompress(c.compress(d.clone())) for c, d in zip(reference, deltas)) / 2
    torch.testing.assert_close(first, expected, rtol=0, atol=0)
    assert int((first != 0).sum()) <= 20
    for memory, delta in zip(exchange.memories, deltas):  # conservation: sent + residual = input
        sent = memory.compressor.decompress(memory.compressor.compress(delta.clone()))
        torch.testing.assert_close(memory.residual() + sent, delta, rtol=0, atol=1e-6)
    assert OuterExchange("fp16", 1.0, 2, [(1000,)]).memories == [None, None]


@pytest.mark.parametrize("name", ["int4", "fp8"])
def test_a_quantizer_as_outer_exchange_averages_its_dequantized_messages_and_keeps_the_rest(name):
    """The quantizers go through the outer exchange as any compressor does: the outer gradient is
    the mean of each site's dequantized message, and each site's residual holds exactly what its
    quantization lost (conservation, error feedback on)."""
    deltas = [torch.randn(1001, generator=torch.Generator().manual_seed(s)) for s in range(2)]
    exchange = OuterExchange(name, 1.0, 2, [(1001,)])
    got = exchange.average(deltas)
    reference = compressors.create(name)
    decoded = [reference.decompress(reference.compress(d.clone())) for d in deltas]
    assert torch.equal(got, sum(decoded) / 2)
    for memory, delta, sent in zip(exchange.memories, deltas, decoded):
        assert torch.equal(memory.residual(), delta - sent)


@pytest.mark.parametrize("outer", [("none", None), ("topk", 0.05), ("fp16", None), ("int4", None)])
def test_diloco_trains_the_transformer_with_each_outer_compressor(outer):
    name, density = outer
    config = replace(TINY, iterations=8, eval_every=4, sync_every=2, optimizer="adamw", lr=3e-3,
                     outer_compressor=name, outer_density=density)
    rows = list(train_diloco(config))
    assert [r["iteration"] for r in rows] == list(range(1, 9))
    assert [r["iteration"] for r in rows if r["eval_loss"] is not None] == [4, 8]
    assert {r["compressor"] for r in rows} == {name}
    assert rows[-1]["eval_loss"] < rows[3]["eval_loss"] + 0.5  # finite and not blowing up
    assert rows[-1]["loss"] < rows[0]["loss"]


@pytest.mark.parametrize("field, value, message", [
    ("sync_every", 0, "sync-every"),
    ("iterations", 6, "multiple of --sync-every"),
    ("outer_lr", 0.0, "outer-lr"),
    ("outer_momentum", 1.0, "outer-momentum"),
    ("outer_compressor", "zip", "unknown compressor"),
    ("optimizer", "lamb", "unknown optimizer"),
])
def test_bad_diloco_settings_are_refused(field, value, message):
    config = replace(TINY, iterations=8, eval_every=4, sync_every=4)
    with pytest.raises(ValueError, match=message):
        replace(config, **{field: value}).check()
    with pytest.raises(ValueError, match="outer-density"):
        replace(config, outer_compressor="topk").check()


def test_per_step_runs_keep_their_stored_configuration():
    # H = 1 with SGD: the key a store holds for today's runs is unchanged (no DiLoCo fields)
    fields = RunConfig("resnet20").as_dict()
    assert fields["optimizer"] == "SGD(momentum=0.9)" and "sync_every" not in fields
    diloco = replace(TINY, iterations=8, eval_every=4, sync_every=4, optimizer="adamw", outer_compressor="topk",
                     outer_density=0.01).as_dict()
    assert diloco["sync_every"] == 4 and diloco["outer_compressor"] == "topk" and diloco["outer_density"] == 0.01
    assert diloco["lr"] == 0.05 and diloco["optimizer"].startswith("AdamW")


def test_a_version_6_store_gains_the_diloco_columns_in_place(tmp_path):
    import sqlite3

    from results.store import MIGRATIONS, Store

    path = tmp_path / "old.sqlite"
    raw = sqlite3.connect(path)
    for step in MIGRATIONS[:6]:
        raw.executescript(step)
    raw.execute("INSERT OR REPLACE INTO meta(key, value) VALUES('schema_version', '6')")
    raw.execute("INSERT INTO convergences(config_key, config_json, created) VALUES('k', '{}', 0)")
    raw.commit()
    raw.close()
    with Store(path) as store:
        old = store.convergence(1)
        assert old["sync_every"] == 1 and old["outer_compressor"] is None and old["outer_density"] is None
        new, _ = store.get_or_create("convergences", {"sync_every": 10}, sync_every=10, outer_compressor="topk",
                                     outer_density=0.01)
        row = store.convergence(new)
        assert (row["sync_every"], row["outer_compressor"], row["outer_density"]) == (10, "topk", 0.01)


def test_diloco_trains_a_cnn_whose_batchnorm_statistics_follow_site_0():
    config = RunConfig("resnet20", workers=2, iterations=4, eval_every=2, width=0.25, batch_size=8, eval_samples=16,
                       sync_every=2, optimizer="adamw", lr=1e-3, outer_compressor="sidco-e", outer_density=0.05)
    seen = []
    rows = list(train_diloco(config, observe=lambda i, m: seen.append([b.clone() for b in m.buffers()])))
    assert all(0 <= r["accuracy"] <= 1 for r in rows if r["accuracy"] is not None)
    assert [torch.equal(a, b) for a, b in zip(seen[0], seen[1])].count(False) > 0  # moved at the outer step
    assert all(torch.equal(a, b) for a, b in zip(seen[1], seen[2]))  # not between outer steps
