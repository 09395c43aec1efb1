"""The graph tasks' metrics (issue 23: Peptides-func's multi-label AP, PascalVOC-sp's macro F1) against scikit-learn."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, f1_score

from pointformers.tasks import metrics


@pytest.mark.parametrize("seed", range(5))
def test_average_precision_matches_scikit_learn_with_ties(seed):
    g = np.random.default_rng(seed)
    target = g.integers(0, 2, 60)
    target[0] = 1
    scores = np.round(g.random(60) + 0.3 * target, 1)          # rounded: many tied scores
    assert metrics.average_precision(scores, target) == pytest.approx(average_precision_score(target, scores))


def test_multilabel_ap_is_ogbs_mean_over_labels_with_both_classes():
    g = np.random.default_rng(7)
    target = g.integers(0, 2, (40, 6)).astype(float)
    target[:, 2] = 1.0                                             # only positives: skipped
    target[g.random((40, 6)) < 0.1] = np.nan                       # unlabelled entries: skipped
    scores = g.normal(size=(40, 6)) + target
    ref = []
    for j in range(6):
        lab = ~np.isnan(target[:, j])
        if len(np.unique(target[lab, j])) == 2:
            ref.append(average_precision_score(target[lab, j], scores[lab, j]))
    assert len(ref) == 5
    assert metrics.multilabel_average_precision(scores, target) == pytest.approx(np.mean(ref))
    with pytest.raises(ValueError, match="no label has both"):
        metrics.multilabel_average_precision(scores[:, 2:3], target[:, 2:3])


@pytest.mark.parametrize("seed", range(5))
def test_macro_f1_matches_scikit_learn(seed):
    g = np.random.default_rng(seed)
    target = g.integers(0, 6, 80)
    logits = g.normal(size=(80, 8))
    logits[np.arange(80), target] += 1.0
    pred = logits.argmax(1)
    assert metrics.macro_f1(torch.as_tensor(logits), target) == pytest.approx(
        f1_score(target, pred, average="macro", zero_division=0))
    assert metrics.macro_f1(target, target) == 1.0
