"""Language modelling (issue 23, FLT §5.1): corpus reader and generator, causal models, task, perplexity."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from pointformers import models
from pointformers.data import language as lang
from pointformers.engine.config import load_config
from pointformers.tasks import metrics
from pointformers.tasks.registry import get_task

ROOT = Path(__file__).resolve().parents[1]
LM_CONFIGS = sorted((ROOT / "configs").glob("language-model-*.yaml"))
SMALL = {"flt-lm": dict(dim=32, depth=2, heads=4, nb_features=16, num_rpe_features=8, chunk_size=8),
         "performer-lm": dict(dim=32, depth=2, heads=4, nb_features=16, chunk_size=8),
         "full-lm": dict(dim=32, depth=2, heads=4),
         "mlp-lm": dict(dim=32, widths=[48])}


# ------------------------------------------------------------------------------------------- metrics
def test_perplexity_matches_scikit_learns_log_loss():
    from sklearn.metrics import log_loss

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 9, 11, generator=g, dtype=torch.float64) * 3
    target = torch.randint(0, 11, (7, 9), generator=g)
    mask = torch.rand(7, 9, generator=g) > 0.3
    probs = torch.softmax(logits[mask], -1).numpy()
    ref = log_loss(target[mask].numpy(), probs, labels=list(range(11)))
    assert metrics.perplexity(logits, target, mask) == pytest.approx(math.exp(ref), rel=1e-9)
    total, n = metrics.token_nll(logits, target, mask)
    assert n == int(mask.sum()) and total / n == pytest.approx(ref, rel=1e-9)
    # a uniform model over V words has perplexity V
    assert metrics.perplexity(torch.zeros(4, 11), torch.arange(4)) == pytest.approx(11.0)


def test_perplexity_rejects_bad_input():
    with pytest.raises(ValueError, match="target: ids"):
        metrics.perplexity(torch.zeros(3, 5), torch.tensor([0, 5, 1]))
    with pytest.raises(ValueError, match="target: expected integer"):
        metrics.perplexity(torch.zeros(3, 5), torch.zeros(3))
    with pytest.raises(ValueError, match="mask: selects no token"):
        metrics.perplexity(torch.zeros(3, 5), torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="NaN"):
        metrics.perplexity(torch.full((2, 5), float("nan")), torch.zeros(2, dtype=torch.long))


# ------------------------------------------------------------------------------------------- data
def test_generated_corpus_is_seeded_sized_and_needs_long_range_context():
    a, b = lang.generate_corpus("tiny", seed=3), lang.generate_corpus("tiny", seed=3)
    p = lang.resolve_params("tiny")
    assert a.vocab == b.vocab and len(a.vocab) == p.vocab_size
    for s, n in zip(lang.SPLITS, p.sizes):
        assert np.array_equal(a.streams[s], b.streams[s]) and len(a.streams[s]) == n
        assert a.streams[s].min() >= 1 and a.streams[s].max() < len(a.vocab)      # never <pad>
    assert not np.array_equal(a.streams["train"][:500], lang.generate_corpus("tiny", seed=4).streams["train"][:500])
    # copying: almost every name in a document was named before in it (its heading names the first)
    big = lang.generate_corpus(lang.resolve_params("small").replace(sizes=(20000, 2, 2)), seed=0)
    toks, vocab = big.streams["train"], big.vocab
    heads = np.flatnonzero((toks[:-3] == vocab.index("=")) & (toks[2:-1] == vocab.index("=")) & (toks[3:] == lang.EOS)
                           & (toks[1:-2] != vocab.index("=")))
    names = {i for i, w in enumerate(vocab) if w[:1].isupper()}
    seen_before = total = 0
    for a0, a1 in zip(heads, [*heads[1:], len(toks)]):
        doc = toks[a0:a1]
        for j, t in enumerate(doc):
            if int(t) in names and j > 1:
                total += 1
                seen_before += int(t) in set(doc[:j].tolist())
    assert total > 100 and seen_before / total > 0.9
    # while the pool is large: a name model without the document's context would be near uniform
    assert len(names) == lang.resolve_params("small").names


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_wikitext_reader_vocabulary_and_streams(tmp_path):
    _write(tmp_path / "wiki.train.tokens", " \n = Valkyria = \n \n the game , the <unk> of Valkyria \n é the \n")
    _write(tmp_path / "wiki.valid.tokens", " the unseen word \n")
    _write(tmp_path / "wiki.test.tokens", "\n")
    c = lang.load_wikitext(tmp_path)
    # specials first, then by count (the 3, Valkyria 2, = 2 in order of first appearance), ties by first appearance
    assert c.vocab[:3] == list(lang.SPECIALS)
    assert c.vocab[3:] == ["the", "=", "Valkyria", "game", ",", "of", "é"]
    ix = {w: i for i, w in enumerate(c.vocab)}
    expect = [lang.EOS, ix["="], ix["Valkyria"], ix["="], lang.EOS, lang.EOS,
              ix["the"], ix["game"], ix[","], ix["the"], lang.UNK, ix["of"], ix["Valkyria"], lang.EOS,
              ix["é"], ix["the"], lang.EOS]
    assert c.streams["train"].tolist() == expect                      # every line, blank ones too, ends in <eos>
    assert c.streams["val"].tolist() == [ix["the"], lang.UNK, lang.UNK, lang.EOS]
    assert c.streams["test"].tolist() == [lang.EOS]
    capped = lang.load_wikitext(tmp_path, ["train"], max_vocab=5)
    assert capped.vocab == [*lang.SPECIALS, "the", "="]
    assert capped.streams["train"].tolist()[:5] == [lang.EOS, 4, lang.UNK, 4, lang.EOS]
    # cached: the same arrays back, and a changed file is read again
    cache = tmp_path / "cache"
    first = lang.load_wikitext(tmp_path, cache_dir=cache)
    assert first.vocab == c.vocab and list((cache / "language").glob("*.npz"))
    _write(tmp_path / "wiki.valid.tokens", " game game \n")
    assert lang.load_wikitext(tmp_path, cache_dir=cache).streams["val"].tolist() == [ix["game"]] * 2 + [lang.EOS]


def test_wikitext_reader_errors_name_the_file_and_line(tmp_path):
    with pytest.raises(ValueError, match="wiki.train.tokens not found"):
        lang.load_wikitext(tmp_path)
    _write(tmp_path / "wiki.train.tokens", "a b\n")
    _write(tmp_path / "wiki.valid.tokens", "a\n")
    (tmp_path / "wiki.test.tokens").write_bytes(b"a b\nok\n\xff\xfe bad\n")
    with pytest.raises(ValueError, match=r"wiki.test.tokens:3: not UTF-8"):
        lang.load_wikitext(tmp_path)
    _write(tmp_path / "wiki.test.tokens", "a <pad> b\n")
    with pytest.raises(ValueError, match=r"wiki.test.tokens:1: the word '<pad>' is reserved"):
        lang.load_wikitext(tmp_path)
    _write(tmp_path / "wiki.train.tokens", "")
    with pytest.raises(ValueError, match="empty"):
        lang.load_wikitext(tmp_path, ["train"])
    with pytest.raises(ValueError, match="max_vocab"):
        lang.build_vocabulary(tmp_path / "wiki.valid.tokens", max_vocab=3)


def test_written_token_file_reads_back_as_the_same_stream(tmp_path):
    c = lang.generate_corpus("tiny", seed=0)
    stream = c.streams["val"]
    stream = stream[: int(np.flatnonzero(stream == lang.EOS)[-1]) + 1]     # whole lines
    lang.write_token_file(tmp_path / "x.tokens", c.vocab, stream)
    index = {w: i for i, w in enumerate(c.vocab)}
    assert np.array_equal(lang.encode_token_file(tmp_path / "x.tokens", index), stream)


def test_windows_predict_every_token_once_without_earlier_context():
    stream = np.arange(1, 24, dtype=np.int32)
    w = lang.lm_windows(stream, 5)
    assert [x.tolist() for x in w[:2]] == [[1, 2, 3, 4, 5, 6], [6, 7, 8, 9, 10, 11]]
    targets = np.concatenate([x[1:] for x in w])
    assert targets.tolist() == stream[1:].tolist()
    assert all(len(x) <= 6 for x in w) and len(w[-1]) >= 2
    with pytest.raises(ValueError, match="block_len"):
        lang.lm_windows(stream, 0)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        lang.lm_windows(stream[:1], 4)


# ------------------------------------------------------------------------------------------- models
def _lm(name: str, vocab: int = 40, **extra) -> torch.nn.Module:
    torch.manual_seed(0)
    return models.build(name, vocab_size=vocab, **{**SMALL[name], **extra}).double().eval()


@pytest.mark.parametrize("name", list(SMALL))
def test_language_models_are_causal(name):
    # no output depends on a later token: change every token from position t on, positions < t keep their logits
    # (L = 37 spans several causal chunks of 8 rows, so the prefix-sum state crosses chunk boundaries)
    m = _lm(name)
    g = torch.Generator().manual_seed(1)
    tok = torch.randint(1, 40, (3, 37), generator=g)
    with torch.no_grad():
        y = m(tok)
        for t in (1, 8, 20, 36):
            other = tok.clone()
            other[:, t:] = torch.randint(1, 40, (3, 37 - t), generator=g)
            y2 = m(other)
            assert torch.allclose(y[:, :t], y2[:, :t], atol=1e-10), (name, t)
            assert not torch.allclose(y[:, t:], y2[:, t:], atol=1e-6), (name, t)   # and later ones do change


@pytest.mark.parametrize("name", list(SMALL))
def test_language_models_ignore_padding(name):
    m = _lm(name)
    g = torch.Generator().manual_seed(2)
    tok = torch.randint(1, 40, (2, 30), generator=g)
    mask = torch.ones(2, 30, dtype=torch.bool)
    mask[1, 17:] = False
    garbage = tok.clone()
    garbage[1, 17:] = 39
    with torch.no_grad():
        y = m(garbage, mask)
        assert torch.allclose(y[1, :17], m(tok[1:, :17])[0], atol=1e-10)
        assert torch.allclose(y[0], m(tok[:1])[0], atol=1e-10)
        assert bool((y[1, 17:] == 0).all())


def test_causal_full_attention_equals_the_masked_dense_softmax():
    from pointformers.attention import build as build_attention
    from pointformers.attention.random_features import dense_softmax_attention

    torch.manual_seed(0)
    att = build_attention("full", dim=16, heads=2, causal=True).double().eval()
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    mask = torch.ones(2, 13, dtype=torch.bool)
    mask[1, 9:] = False
    with torch.no_grad():
        q, k, v = att.heads_of(att.w_q(x)), att.heads_of(att.w_k(x)), att.heads_of(att.w_v(x))
        ref = att.merge_heads(dense_softmax_attention(q @ k.transpose(-1, -2) / 8 ** 0.5, v, mask, causal=True), mask)
        assert torch.allclose(att(x, None, mask), ref, atol=1e-10)
        assert torch.allclose(att(x[:1]), ref[:1], atol=1e-10)   # no mask: SDPA's is_causal path


def test_a_mechanism_without_a_causal_mode_is_refused():
    with pytest.raises(ValueError, match="no causal mode"):
        models.build("flt-lm", vocab_size=20, dim=16, heads=2, attention="samsa")


def test_flt_lm_has_no_absolute_positions_and_the_twins_do():
    assert _lm("flt-lm").pos_embed is None
    assert _lm("performer-lm").pos_embed is not None and _lm("full-lm").pos_embed is not None
    m = _lm("flt-lm")
    assert m.out.weight is m.embed.weight                                   # tied output layer


# ------------------------------------------------------------------------------------------- task
def _tiny(path: Path, tmp_path: Path) -> dict:
    return load_config(path, [f"data.cache_dir={tmp_path}", "data.preset=tiny", "data.block_len=32",
                              "data.mini_batch=4", "train.epochs=1"])


def test_every_language_model_config_trains_and_its_loss_falls(tmp_path):
    assert {load_config(p)["model"]["name"] for p in LM_CONFIGS} == {"flt-lm", "performer-lm", "full-lm", "mlp-lm"}
    for path in LM_CONFIGS:
        cfg = _tiny(path, tmp_path)
        spec = get_task("language-model")
        samples = spec.load(cfg, ("train", "val"), False)
        torch.manual_seed(0)
        model = models.build(cfg["model"]["name"], **cfg["model"]["options"])
        task = spec.build(cfg)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        batch = samples["train"][0]
        losses = []
        for _ in range(12):
            loss = task.loss(model, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        assert losses[-1] < 0.8 * losses[0], (path.name, losses)
        out = task.evaluate(model, samples["val"])
        assert out["perplexity"] == pytest.approx(math.exp(out["loss"])) and 0 <= out["accuracy"] <= 1


def test_evaluate_is_the_perplexity_over_every_predicted_token(tmp_path):
    cfg = _tiny(LM_CONFIGS[0], tmp_path)
    spec = get_task("language-model")
    val = spec.load(cfg, ("val",), False)["val"]
    torch.manual_seed(0)
    model = models.build(cfg["model"]["name"], **cfg["model"]["options"]).eval()
    logits, targets = [], []
    with torch.no_grad():
        for s in val:
            b = s.tensors()
            lg = model(b["tokens"][:, :-1], b["mask"][:, :-1])
            keep = b["mask"][:, 1:]
            logits.append(lg[keep])
            targets.append(b["tokens"][:, 1:][keep])
    n_tokens = sum(len(t) for t in targets)
    corpus = lang.load_generated_corpus("tiny", cache_dir=tmp_path)
    assert n_tokens == len(corpus.streams["val"]) - 1                    # every token after the first, once
    ref = torch.nn.functional.cross_entropy(torch.cat(logits).double(), torch.cat(targets))
    assert spec.build(cfg).evaluate(model, val)["perplexity"] == pytest.approx(math.exp(float(ref)), rel=1e-5)


def test_config_errors_name_the_key(tmp_path):
    cfg = _tiny(LM_CONFIGS[0], tmp_path)
    for key, value, match in (("model.options.vocab_size", 10, "model.options.vocab_size"),
                              ("data.block_len", 0, "data.block_len"), ("data.preset", "huge", "data.preset"),
                              ("data.max_vocab", 2, "data.max_vocab")):
        bad = {**cfg, "data": dict(cfg["data"]), "model": {**cfg["model"], "options": dict(cfg["model"]["options"])}}
        section, *rest = key.split(".")
        target = bad[section] if len(rest) == 1 else bad[section][rest[0]]
        target[rest[-1]] = value
        with pytest.raises(ValueError, match=match):
            get_task("language-model").validate(bad)
