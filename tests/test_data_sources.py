"""Real data offline: the pydoc text corpus, a CIFAR-10 python directory and a UTF-8 text file as
``--data``; a hostile CIFAR pickle is refused in one line; the harder synthetic images."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from convergence import RunConfig, train
from sidco.cli import main
from traces import workloads
from traces.workloads import corpus
from traces.workloads.cifar import CifarData

pytestmark = pytest.mark.usefixtures("one_thread")


def test_tokenisation_is_the_stated_rule():
    assert corpus.tokenize("The x = f(10).\nNext") == ["the", "x", "=", "f", "(", "10", ")", ".", "next"]
    vocab = corpus.vocabulary(["b", "a", "b", "c", "a", "b", "d"], 3)
    assert vocab == {"<unk>": 0, "b": 1, "a": 2}  # most frequent first, ties by token, the rest <unk>


def test_pydoc_corpus_loads_offline_and_holds_out_whole_topics():
    from pydoc_data.topics import topics

    train_texts, held_texts = corpus.pydoc_texts()
    names = sorted(topics)
    assert len(train_texts) + len(held_texts) == len(names)
    assert set(held_texts) | set(train_texts) == set(topics.values()) and not set(held_texts) & set(train_texts)
    share = sum(map(len, held_texts)) / sum(map(len, topics.values()))
    assert 0.09 < share <= 0.1
    data = workloads.build("lstm").data
    assert isinstance(data, corpus.TextCorpus) and data.vocab == 2000 and len(data.vocabulary) == 2000
    assert data.train.numel() > 50_000 and data.heldout.numel() > 5_000
    x, y = data.batch(1, 2, 0, 4)
    assert x.shape == y.shape == (4, 35) and torch.equal(x[:, 1:], y[:, :-1])
    hx, hy = data.heldout_batch(0, 3)
    assert torch.equal(hx[0], data.heldout[:35]) and torch.equal(hy[0], data.heldout[1:36])
    # worker 1 of 2 draws its windows from the second half of the training stream only
    half = data.train.numel() // 2
    windows = data.train.unfold(0, 36, 1)
    for index in range(3):
        x, y = data.batch(1, 2, index, 4)
        for row in torch.cat([x, y[:, -1:]], dim=1):
            starts = (windows == row).all(dim=1).nonzero().flatten().tolist()
            assert any(half <= s <= 2 * half - 36 for s in starts)
    assert data.unigram_loss() > 4.0


def test_a_two_worker_lstm_learns_the_pydoc_text_below_the_unigram_loss():
    # the best context-free model's held-out loss is 4.71 nats; 80 steps at lr 3 reach 4.43 (1 thread, seed 0)
    config = RunConfig("lstm", workers=2, iterations=80, eval_every=80, width=0.25, eval_samples=64, lr=3.0)
    unigram = workloads.build("lstm").data.unigram_loss()
    last = list(train(config, "none", 1.0))[-1]
    assert last["eval_loss"] < unigram - 0.2, (last["eval_loss"], unigram)


def _cifar_dir(path: Path, per_class: int = 6, seed: int = 0) -> Path:
    """A CIFAR-10 python directory with a few learnable images per class (class c: channel c % 3 bright)."""
    rng = np.random.default_rng(seed)
    path.mkdir()
    for name, count in (("data_batch_1", per_class), ("data_batch_2", per_class), ("test_batch", per_class)):
        labels = [c for c in range(10) for _ in range(count)]
        data = rng.integers(0, 60, size=(len(labels), 3, 32, 32), dtype=np.uint8)
        for i, label in enumerate(labels):
            data[i, label % 3, :, : 3 + 3 * label] += 150
        batch = {b"batch_label": name.encode(), b"labels": labels, b"data": data.reshape(len(labels), 3072),
                 b"filenames": [f"{i}.png".encode() for i in range(len(labels))]}
        (path / name).write_bytes(pickle.dumps(batch, protocol=2))
    return path


def test_cifar_directory_loads_and_trains(tmp_path, capsys):
    directory = _cifar_dir(tmp_path / "cifar")
    data = CifarData(directory)
    assert data.images.shape == (120, 3, 32, 32) and data.test_images.shape == (60, 3, 32, 32)
    assert torch.allclose(data.images.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-5)
    raw = pickle.loads((directory / "test_batch").read_bytes(), encoding="bytes")
    x, y = data.heldout_batch(0, 5)
    assert y.tolist() == raw[b"labels"][:5]
    expected = (torch.from_numpy(raw[b"data"][:5].reshape(5, 3, 32, 32)).float() / 255 - data.mean) / data.std
    assert torch.allclose(x, expected)
    shard = data.order[60:]
    for index in range(3):
        images, labels = data.batch(1, 2, index, 4)
        for image, label in zip(images, labels):  # an image of worker 1's half, maybe flipped left-right
            match = [int(i) for i in shard if torch.equal(data.images[i], image) or
                     torch.equal(data.images[i].flip(-1), image)]
            assert match and all(int(data.labels[i]) == int(label) for i in match)
    store = tmp_path / "r.sqlite"
    assert main(["converge", "--workload", "resnet20", "--width", "0.25", "--workers", "2", "--iterations", "4",
                 "--eval-every", "2", "--eval-samples", "20", "--compressors", "none", "--data", str(directory),
                 "--no-replay", "--store", str(store), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert str(directory.resolve()) in out["source"] and len(out["rows"]) == 4
    assert all(r["accuracy"] is not None for r in out["rows"] if r["iteration"] in (2, 4))


def test_a_hostile_cifar_pickle_is_refused_in_one_line(tmp_path, capsys):
    directory = _cifar_dir(tmp_path / "cifar")
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    (directory / "data_batch_2").write_bytes(pickle.dumps({b"data": Payload(), b"labels": []}, protocol=2))
    with pytest.raises(ValueError, match=r"refused .*data_batch_2: it pickles (posix|os)\.system"):
        CifarData(directory)
    assert main(["converge", "--workload", "resnet20", "--workers", "2", "--iterations", "2", "--eval-every", "2",
                 "--compressors", "none", "--data", str(directory), "--store", str(tmp_path / "r.sqlite")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refused" in err[0] and "not one of the CIFAR-10 format's arrays" in err[0]
    assert not marker.exists() and not (tmp_path / "r.sqlite").exists()


@settings(max_examples=30, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_as_a_cifar_batch_are_a_value_error(tmp_path_factory, blob):
    directory = _cifar_dir(tmp_path_factory.mktemp("c") / "cifar", per_class=1)
    (directory / "data_batch_1").write_bytes(blob)
    with pytest.raises(ValueError, match="data_batch_1"):
        CifarData(directory)


def test_a_text_file_is_data_for_the_text_workloads(tmp_path, capsys):
    from pydoc_data.topics import topics

    text = tmp_path / "book.txt"
    text.write_text("\n".join(topics[n] for n in sorted(topics)[:20]), encoding="utf-8")
    data = workloads.data_source("lstm", str(text))
    lines = text.read_text(encoding="utf-8").splitlines()
    held = lines[len(lines) - int(len(lines) * corpus.HELDOUT_FRACTION):]
    assert torch.equal(data.heldout, corpus.encode(["\n".join(held)], data.vocabulary))
    assert main(["converge", "--workload", "lstm", "--width", "0.25", "--workers", "2", "--iterations", "3",
                 "--eval-every", "3", "--eval-samples", "8", "--compressors", "none", "--data", str(text),
                 "--no-replay", "--store", str(tmp_path / "r.sqlite"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows[-1]["eval_loss"] < np.log(2000)
    assert main(["capture", "--workload", "lstm", "--width", "0.25", "--workers", "2", "--iterations", "2",
                 "--every", "1", "--data", str(text), "--out", str(tmp_path / "trace"), "--store",
                 str(tmp_path / "r.sqlite"), "--json"]) == 0
    capsys.readouterr()
    import traces

    assert traces.open(tmp_path / "trace").manifest["capture"]["data"] == str(text)
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9\n" * 10)
    for bad, message in ((tmp_path / "latin1.txt", "not UTF-8"), (tmp_path, "text workload"),
                         (tmp_path / "missing.txt", "no such file")):
        assert main(["converge", "--workload", "lstm", "--data", str(bad), "--store", str(tmp_path / "s.sqlite")]) == 2
        assert message in capsys.readouterr().err
    assert main(["converge", "--workload", "resnet20", "--data", "pydoc", "--store", str(tmp_path / "s.sqlite")]) == 2
    assert "image workload" in capsys.readouterr().err


def test_synthetic_images_have_the_stated_ceiling():
    """Blends at m in (1 - b, b) are as likely from (y, z, m) as from (z, y, 1 - m): the fraction of
    such samples is (2b - 1) / b, so the Bayes accuracy is at most 1 - (2b - 1) / (2b)."""
    data = workloads.data.ImageData(seed=0)
    b = data.blend
    assert 1 - (2 * b - 1) / (2 * b) == pytest.approx(0.8333, abs=1e-4)
    x, y = data.heldout_batch(0, 16)
    assert x.shape == (16, 3, 32, 32) and int(y.max()) < 10
    # with neither noise nor shift a sample is contrast x ((1 - m) T_y + m T_z), m < b, z != y
    clean = workloads.data.ImageData(seed=0, noise=0.0, shift=0)
    images, labels = clean.batch(0, 1, 0, 8)
    basis = clean.templates.flatten(1).T.double()
    for image, label in zip(images, labels):
        coefficients = torch.linalg.lstsq(basis, image.flatten().double().unsqueeze(1)).solution.flatten()
        used = (coefficients.abs() > 1e-6).nonzero().flatten().tolist()
        assert int(label) in used and len(used) <= 2
        total = float(coefficients.sum())
        assert 0.5 <= total < 1.5 and float(coefficients[label]) / total > 1 - b
