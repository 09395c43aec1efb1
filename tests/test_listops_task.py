"""ListOps task: length-sorted mini-batches, cross-entropy, accuracy, LRA TSV folders, config checks."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pointformers.data.listops import VOCAB, ListOpsSet, write_listops_tsv
from pointformers.tasks import metrics
from pointformers.tasks.listops import ListOpsTask, listops_pool
from pointformers.tasks.registry import get_task


class FirstDigit(nn.Module):
    """Predicts the value of the first digit token in each sequence (10 classes)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(2.0))

    def forward(self, tokens, mask=None):
        digit = (tokens >= VOCAB["0"]) & (tokens <= VOCAB["9"]) & mask
        first = torch.argmax(digit.int(), 1)
        val = tokens.gather(1, first[:, None])[:, 0] - VOCAB["0"]
        return self.w * F.one_hot(val, 10).float()


def _set() -> ListOpsSet:
    srcs = ["[MAX 2 9 ]", "[MIN 4 [SM 1 2 ] ]", "7", "[MED 1 5 3 8 ]", "[SM 9 9 ]"]
    from pointformers.data.listops import encode, evaluate

    return ListOpsSet([encode(s) for s in srcs], np.array([evaluate(s) for s in srcs], np.int64))


def test_accuracy_equals_the_metrics_module_and_a_hand_count():
    data = _set()                        # values 9, 3, 7, 4, 8; first digits 2, 4, 7, 1, 9
    pool = listops_pool(data)
    order = torch.from_numpy(np.argsort(pool.sizes.numpy(), kind="stable"))
    samples = pool.batches(2, order=order)
    assert [len(b) for b in samples] == [2, 2, 1]
    lens = [int(b.tensors()["mask"].sum(1).max()) for b in samples]
    assert lens == sorted(lens)                                         # length-sorted batches
    task = ListOpsTask()
    out = task.evaluate(FirstDigit(), samples)
    assert out["accuracy"] == pytest.approx(1 / 5)                      # only "7" is right
    logits, labels = task.predict(FirstDigit(), samples)
    assert out["accuracy"] == metrics.accuracy(logits, labels)
    assert out["loss"] == pytest.approx(float(F.cross_entropy(logits, labels)))


def test_loss_is_cross_entropy_on_padded_batches_and_reaches_the_model():
    pool = listops_pool(_set())
    sample = pool.batches(5)[0]
    t = sample.tensors()
    assert t["tokens"].shape == (5, 7) and bool((t["tokens"][~t["mask"]] == VOCAB["<pad>"]).all())
    model = FirstDigit()
    loss = ListOpsTask().loss(model, sample)
    ref = F.cross_entropy(FirstDigit()(t["tokens"], t["mask"]), t["labels"])
    assert float(loss.detach()) == pytest.approx(float(ref.detach()))
    loss.backward()
    assert model.w.grad is not None and model.w.grad != 0
    with pytest.raises(ValueError, match="C >= 10"):
        ListOpsTask().loss(type("M", (nn.Module,), {"forward": lambda self, t, m=None: torch.zeros(t.shape[0], 3)})(),
                           sample)


def test_tsv_folder_and_generated_data_through_the_registry(tmp_path):
    spec = get_task("listops")
    for s, rows in (("train", [("[MAX 2 9 ]", 9), ("3", 3)]), ("val", [("[MIN 4 5 ]", 4)]), ("test", [("1", 1)])):
        write_listops_tsv(tmp_path / f"basic_{s}.tsv", rows)
    cfg = {"data": {"root": str(tmp_path), "mini_batch": 4}, "model": {"name": "mlp-seq", "options": {}},
           "task": {"name": "listops"}}
    spec.validate(cfg)
    out = spec.load(cfg, ("train", "val", "test"), False)
    assert out["train"][0].tensors()["labels"].tolist() == [3, 9]        # sorted by length
    (tmp_path / "basic_test.tsv").write_text("Source\tTarget\n[MAX 2 9 ]\t11\n")
    with pytest.raises(ValueError, match=r"basic_test.tsv:2"):
        spec.load(cfg, ("test",), False)
    gen = {"data": {"preset": "tiny", "cache_dir": str(tmp_path / "c"), "mini_batch": 8},
           "model": {"name": "mlp-seq", "options": {}}, "task": {"name": "listops"}}
    samples = spec.load(gen, ("val",), False)["val"]
    assert sum(len(b) for b in samples) == 16


def test_validate_names_the_bad_key(tmp_path):
    spec = get_task("listops")
    base = {"data": {"preset": "tiny"}, "model": {"name": "samsa-seq", "options": {}}, "task": {"name": "listops"}}
    spec.validate(base)
    cases = [({"data": {"preset": "huge"}}, r"data\.preset"), ({"data": {"root": str(tmp_path / "x")}}, r"data\.root"),
             ({"data": {"preset": "tiny", "mini_batch": 0}}, r"data\.mini_batch"),
             ({"model": {"name": "samsa-seq", "options": {"num_classes": 5}}}, r"model\.options\.num_classes"),
             ({"model": {"name": "samsa-seq", "options": {"vocab_size": 10}}}, r"model\.options\.vocab_size"),
             ({"model": {"name": "samsa-seq", "options": {"max_len": 50}}}, r"model\.options\.max_len"),
             ({"task": {"name": "listops", "label_smoothing": 1.5}}, r"task\.label_smoothing")]
    for change, key in cases:
        with pytest.raises(ValueError, match=key):
            spec.validate({**base, **change})
