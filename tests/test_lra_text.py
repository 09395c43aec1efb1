"""LRA Text (issue 23): byte encoding, the IMDb reader, the stand-in reviews and the task."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pointformers.data import byte_text as bt
from pointformers.engine.config import load_config
from pointformers.tasks.registry import get_task

from config_training import train_config_steps

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("lra-text-*.yaml"))


def test_bytes_are_tokens_one_above_their_value():
    t = bt.encode_bytes("aé")                       # é is two UTF-8 bytes
    assert t.tolist() == [ord("a") + 1, 0xC3 + 1, 0xA9 + 1]
    assert bt.encode_bytes("abcdef", max_len=4).tolist() == [98, 99, 100, 101]
    assert bt.encode_bytes(bytes([0, 255])).tolist() == [1, 256]      # never the padding id 0, below 257


def _label_from_text(text: str) -> int:
    """The documented rule, read back from the words: positive cues (not negated) outnumber negative ones."""
    words = [w.strip(".").lower() for w in text.split()]
    score = 0
    for i, w in enumerate(words):
        if w in bt._POSITIVE or w in bt._NEGATIVE:
            negated = i > 0 and words[i - 1] == "not"
            score += 1 if (w in bt._POSITIVE) != negated else -1
    return int(score > 0)


def test_stand_in_labels_follow_the_scattered_cues_and_fit_the_length():
    p = bt.resolve_params("tiny")
    data = bt.generate_reviews(p, seed=0)
    again = bt.generate_reviews(p, seed=0)
    for s, n in zip(bt.SPLITS, p.sizes):
        texts, labels = data[s]
        assert texts == again[s][0] and len(texts) == n
        assert [_label_from_text(t) for t in texts] == labels.tolist()
        assert max(len(t.encode()) for t in texts) <= p.length[1]
        cues = [sum(w.strip(".").lower() in bt._POSITIVE + bt._NEGATIVE for w in t.split()) for t in texts]
        assert set(cues) == {p.cues}
    small = bt.generate_reviews(bt.resolve_params("small").replace(sizes=(400, 1, 1)), seed=1)["train"]
    assert 0.4 < small[1].mean() < 0.6                                  # balanced classes
    # the cues lie far apart: the mean distance between a review's first and last cue is hundreds of bytes
    spans = []
    for t in small[0][:50]:
        pos = [i for i, w in enumerate(t.split()) if w.strip(".").lower() in bt._POSITIVE + bt._NEGATIVE]
        spans.append(len(" ".join(t.split()[pos[0]:pos[-1]])))
    assert np.mean(spans) > 300
    with pytest.raises(ValueError, match="cues"):
        bt.ReviewParams(cues=4)
    # a maximum that cannot hold the cues is an error naming length, not an endless redraw
    with pytest.raises(ValueError, match=r"length: no review of at most 256 bytes with 7 cues"):
        bt.generate_reviews(dict(length=(200, 256), cues=7, words=50, sizes=(2, 1, 1)))


def _imdb(root: Path) -> None:
    for split, n in (("train", 5), ("test", 2)):
        for label in ("pos", "neg"):
            d = root / split / label
            d.mkdir(parents=True)
            for i in range(n):
                (d / f"{i}_7.txt").write_text(f"{label} review {i} <br /> très bien" if label == "pos" else f"bad {i}",
                                              encoding="utf-8")


def test_imdb_reader(tmp_path):
    _imdb(tmp_path)
    sets = bt.load_imdb(tmp_path, max_len=12, val_fraction=0.2, seed=0)
    assert len(sets["train"]) == 8 and len(sets["val"]) == 2 and len(sets["test"]) == 4
    assert sorted(sets["val"].labels.tolist()) == [0, 1]                  # per class
    assert sets["test"].labels.tolist() == [0, 0, 1, 1]
    assert sets["test"].tokens[2].tolist() == bt.encode_bytes("pos review 0 <br /> très bien", 12).tolist()
    assert all(len(t) <= 12 for t in sets["train"].tokens)
    again = bt.load_imdb(tmp_path, max_len=12, val_fraction=0.2, seed=0)
    assert [t.tolist() for t in again["val"].tokens] == [t.tolist() for t in sets["val"].tokens]
    (tmp_path / "test" / "neg" / "9_1.txt").write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match=r"9_1.txt: not UTF-8"):
        bt.load_imdb(tmp_path, ["test"])
    with pytest.raises(ValueError, match=r"no reviews in .*train.neg"):
        bt.load_imdb(tmp_path / "nowhere", ["train"])


@pytest.mark.heavy
def test_every_lra_text_config_trains_and_its_loss_falls(tmp_path):
    assert {p.stem for p in CONFIGS} == {"lra-text-samsa", "lra-text-sft", "lra-text-full", "lra-text-performer", "lra-text-mlp"}
    spec = get_task("lra-text")
    for path in CONFIGS:
        losses, task, model, samples = train_config_steps(
            path, [f"data.cache_dir={tmp_path}", "data.preset=tiny", "data.max_len=260", "data.mini_batch=8"], 20)
        assert losses[-1] < 0.8 * losses[0], (path.name, losses)
        out = task.evaluate(model, samples["val"])
        assert 0 <= out["accuracy"] <= 1 and np.isfinite(out["loss"])


def test_lra_text_config_errors_name_the_key():
    spec = get_task("lra-text")
    cfg = load_config(CONFIGS[0])
    for section, key, value, match in (("data", "max_len", 0, "data.max_len"), ("data", "preset", "huge", "data.preset"),
                                       ("data", "val_fraction", 1.5, "data.val_fraction")):
        with pytest.raises(ValueError, match=match):
            spec.validate({**cfg, section: {**cfg[section], key: value}})
    small = {**cfg, "model": {**cfg["model"], "options": {**cfg["model"]["options"], "max_len": 512}}}
    with pytest.raises(ValueError, match="model.options.max_len"):
        spec.validate(small)
    vocab = {**cfg, "model": {**cfg["model"], "options": {**cfg["model"]["options"], "vocab_size": 256}}}
    with pytest.raises(ValueError, match="model.options.vocab_size"):
        spec.validate(vocab)
