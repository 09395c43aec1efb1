"""LRA Retrieval (issue 23): the AAN pair reader, the stand-in pairs, the dual encoder and the task."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pointformers import models
from pointformers.data import byte_text as bt
from pointformers.data import retrieval as rt
from pointformers.engine.config import load_config
from pointformers.tasks.registry import get_task

from config_training import train_config_steps

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("lra-retrieval-*.yaml"))


def test_aan_reader(tmp_path):
    rows = ["1\tW01-1\tP02-3\tA paper on parsing.\tAnother on parsing.",
            "0.0\tW01-2\tP05-1\tSome text\tUnrelated text é",
            ""]
    for split, name in rt.AAN_FILES.items():
        (tmp_path / name).write_text("\n".join(rows), encoding="utf-8")
    sets = rt.load_aan(tmp_path, max_len=10)
    assert len(sets["train"]) == 2 and sets["val"].labels.tolist() == [1, 0]
    assert (sets["test"].first[0] - 1).astype(np.uint8).tobytes() == b"A paper on"      # cut to 10 bytes
    assert len(sets["train"].second[1]) == 10
    bad = tmp_path / "bad.tsv"
    bad.write_text("1\tonly\tthree\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.tsv:1: expected 5 tab-separated columns"):
        rt.read_aan_tsv(bad)
    bad.write_text("1\ta\tb\tx\ty\n2\ta\tb\tx\ty\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.tsv:2: label must be 0 or 1"):
        rt.read_aan_tsv(bad)
    bad.write_bytes(b"1\ta\tb\t\xff\xfe\ty\n")
    with pytest.raises(ValueError, match="not UTF-8"):
        rt.read_aan_tsv(bad)
    (tmp_path / rt.AAN_FILES["test"]).unlink()
    with pytest.raises(ValueError, match="new_aan_pairs.test.tsv not found"):
        rt.load_aan(tmp_path)


def test_stand_in_pairs_match_by_topic_terms(monkeypatch):
    p = rt.PairParams(**rt.PRESETS["tiny"])
    a, b = rt.generate_pairs(p, seed=1), rt.generate_pairs(p, seed=1)
    assert a["train"][0] == b["train"][0] and np.array_equal(a["test"][2], b["test"][2])
    first, second, labels = a["train"]
    assert 0.3 < labels.mean() < 0.7
    assert all(len(t.encode()) <= p.length[1] for t in first + second)
    # the label is carried by words that occur in few papers: positive pairs share more of them
    docs = [set(t.replace(".", "").lower().split()) for t in first + second]
    freq = {}
    for d in docs:
        for w in d:
            freq[w] = freq.get(w, 0) + 1
    rare = {w for w, c in freq.items() if c <= len(docs) // 4}
    shared = np.array([len(set(f.replace(".", "").lower().split()) & set(s.replace(".", "").lower().split()) & rare)
                       for f, s in zip(first, second)])
    assert shared[labels == 1].mean() > shared[labels == 0].mean() + 0.5
    with pytest.raises(ValueError, match="topics"):
        rt.PairParams(topics=3)
    with pytest.raises(ValueError, match="length"):
        rt.PairParams(length=(100, 110), mentions=4)
    # a paper that never fits is an error naming length after the drafts run out, not an endless redraw
    monkeypatch.setattr(bt, "MAX_DRAFTS", 0)
    with pytest.raises(ValueError, match=r"length: no paper of at most 300 bytes with 3 mentions"):
        rt.generate_pairs("tiny")


def test_dual_encoder_reads_both_documents_with_one_encoder():
    torch.manual_seed(0)
    m = models.build("dual-encoder", encoder="full-seq", embed_dim=8, hidden=8,
                     encoder_options=dict(vocab_size=257, dim=16, heads=2, depth=1, max_len=64)).eval()
    a = torch.randint(1, 257, (3, 20))
    b = torch.randint(1, 257, (3, 30))
    am, bm = torch.ones_like(a, dtype=torch.bool), torch.ones_like(b, dtype=torch.bool)
    out = m(a, am, b, bm)
    assert out.shape == (3, 2)
    # the same as encoding each document alone (padding to the longer length changes nothing)
    u, v = m.encoder(a, am), m.encoder(b, bm)
    torch.testing.assert_close(out, m.head(torch.cat([u, v, u * v, u - v], -1)), atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="first, second"):
        m(a, am, b[:2], bm[:2])
    with pytest.raises(ValueError, match="encoder_options.num_classes"):
        models.build("dual-encoder", encoder_options={"num_classes": 3})


def test_every_lra_retrieval_config_trains_and_its_loss_falls(tmp_path):
    assert {p.stem for p in CONFIGS} == {f"lra-retrieval-{k}" for k in ("samsa", "sft", "full", "performer", "mlp")}
    for path in CONFIGS:
        losses, task, model, samples = train_config_steps(
            path, [f"data.cache_dir={tmp_path}", "data.preset=tiny", "data.max_len=300", "data.mini_batch=8"])
        assert losses[-1] < 0.8 * losses[0], (path.name, losses)
        out = task.evaluate(model, samples["val"])
        assert 0 <= out["accuracy"] <= 1 and np.isfinite(out["loss"])


def test_lra_retrieval_config_errors_name_the_key():
    spec = get_task("lra-retrieval")
    cfg = load_config(CONFIGS[0])
    for key, value, match in (("max_len", 0, "data.max_len"), ("preset", "huge", "data.preset"),
                              ("root", "/no/such/dir", "data.root")):
        with pytest.raises(ValueError, match=match):
            spec.validate({**cfg, "data": {**cfg["data"], key: value}})
    opts = cfg["model"]["options"]
    for enc, match in (({"max_len": 512}, "encoder_options.max_len"), ({"vocab_size": 256}, "encoder_options.vocab_size")):
        bad = {**cfg, "model": {**cfg["model"], "options": {**opts, "encoder_options": {**opts["encoder_options"], **enc}}}}
        with pytest.raises(ValueError, match=match):
            spec.validate(bad)
