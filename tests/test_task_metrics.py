"""Task metrics on hand-computed cases: OA/mAcc, part mIoU, mixture log-likelihood and EM, MAE."""
import math
import warnings

import pytest
import torch

from pointformers.tasks.metrics import (MixtureParams, accuracy, clustering_log_likelihoods, em_step,
                                        energy_within_threshold, mean_absolute_error, mean_class_accuracy,
                                        mixture_log_likelihood, overall_accuracy, part_segmentation_mious,
                                        restricted_part_predictions, shape_part_ious)


# ------------------------------------------------------------------------------------------ OA / mAcc
def test_oa_and_macc_hand_case():
    target = torch.tensor([0, 0, 0, 1, 1, 2])
    pred = torch.tensor([0, 0, 1, 1, 0, 2])
    assert overall_accuracy(pred, target) == pytest.approx(4 / 6)
    assert accuracy(pred, target) == pytest.approx(4 / 6)
    # per class: 2/3, 1/2, 1/1
    assert mean_class_accuracy(pred, target) == pytest.approx((2 / 3 + 1 / 2 + 1) / 3)
    # logits give the same as their argmax labels
    logits = torch.nn.functional.one_hot(pred, 4).double() * 3 + 0.1 * torch.arange(4.0)
    assert overall_accuracy(logits, target) == pytest.approx(4 / 6)
    # a class predicted but absent from the targets does not enter the mean
    pred2 = torch.tensor([0, 3, 1, 1, 0, 2])
    assert mean_class_accuracy(pred2, target) == pytest.approx((1 / 3 + 1 / 2 + 1) / 3)


def test_macc_differs_from_oa_on_imbalanced_data():
    target = torch.tensor([0] * 9 + [1])
    pred = torch.zeros(10, dtype=torch.long)
    assert overall_accuracy(pred, target) == pytest.approx(0.9)
    assert mean_class_accuracy(pred, target) == pytest.approx(0.5)


@pytest.mark.parametrize("pred,target,match", [
    (torch.tensor([0, 1]), torch.tensor([0]), "target"),
    (torch.tensor([0.5, 1.0]), torch.tensor([0, 1]), "pred"),
    (torch.tensor([[0.1, float("nan")]]), torch.tensor([0]), "pred"),
    (torch.tensor([0, -1]), torch.tensor([0, 1]), "pred"),
    (torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long), "target"),
])
def test_classification_metrics_reject_bad_input(pred, target, match):
    with pytest.raises(ValueError, match=match):
        overall_accuracy(pred, target)


# ------------------------------------------------------------------------------------------ mIoU
PARTS = [[0, 1], [2, 3, 4]]   # category 0 has parts {0, 1}; category 1 has parts {2, 3, 4}


def test_shape_iou_with_absent_part_counts_one():
    # part 4 is in neither prediction nor truth: IoU = 1 (PointNet convention)
    ious = shape_part_ious(torch.tensor([2, 2, 3, 2]), torch.tensor([2, 2, 3, 3]), PARTS[1])
    assert ious.tolist() == pytest.approx([2 / 3, 1 / 2, 1.0])
    # a part predicted but absent from the truth has IoU 0
    ious = shape_part_ious(torch.tensor([2, 4]), torch.tensor([2, 2]), PARTS[1])
    assert ious.tolist() == pytest.approx([1 / 2, 1.0, 0.0])


def test_class_and_instance_miou_hand_case():
    preds = [torch.tensor([0, 1, 1, 1]), torch.tensor([2, 2, 3, 2]), torch.tensor([2, 3, 4])]
    targets = [torch.tensor([0, 0, 1, 1]), torch.tensor([2, 2, 3, 3]), torch.tensor([2, 3, 4])]
    cats = torch.tensor([0, 1, 1])
    a = (1 / 2 + 2 / 3) / 2          # shape 0: IoU(part 0) = 1/2, IoU(part 1) = 2/3
    b = (2 / 3 + 1 / 2 + 1) / 3      # shape 1: part 4 absent from both -> 1
    c = 1.0
    out = part_segmentation_mious(preds, targets, cats, PARTS)
    assert out["instance_miou"] == pytest.approx((a + b + c) / 3)
    assert out["class_miou"] == pytest.approx((a + (b + c) / 2) / 2)


def test_restricted_predictions_only_pick_category_parts():
    logits = torch.tensor([[[0.0, 1.0, 9.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0, 0.1]],
                           [[9.0, 0.0, 0.0, 1.0, 0.5], [0.0, 9.0, 0.0, 0.0, 0.2]]])
    cat = torch.tensor([0, 1])
    mask = torch.tensor([[True, True], [True, False]])
    pred = restricted_part_predictions(logits, cat, PARTS, mask)
    # shape 0 (parts 0, 1): global argmax 2 is not allowed -> 1; shape 1 (parts 2-4): 3; padded -> -1
    assert pred.tolist() == [[1, 0], [3, -1]]


def test_miou_rejects_parts_outside_the_category():
    with pytest.raises(ValueError, match="targets\\[0\\]"):
        part_segmentation_mious([torch.tensor([0])], [torch.tensor([3])], torch.tensor([0]), PARTS)
    with pytest.raises(ValueError, match="categories"):
        part_segmentation_mious([torch.tensor([0])], [torch.tensor([0])], torch.tensor([5]), PARTS)


# ------------------------------------------------------------------------------------------ mixture LL
def _log_normal(x, m, s):
    return -0.5 * ((x - m) / s) ** 2 - math.log(s) - 0.5 * math.log(2 * math.pi)


def test_mixture_log_likelihood_hand_case_with_padding():
    f64 = dict(dtype=torch.float64)
    log_pi = torch.tensor([[math.log(0.25), math.log(0.75)]], **f64)
    mu = torch.tensor([[[0.0, 0.0], [2.0, 0.0]]], **f64)
    sigma = torch.tensor([[[1.0, 1.0], [1.0, 2.0]]], **f64)
    x = torch.tensor([[[0.0, 0.0], [2.0, 1.0], [1e9, float("nan")]]], **f64)
    mask = torch.tensor([[True, True, False]])
    ll = mixture_log_likelihood(x, MixtureParams(log_pi, mu, sigma), mask)

    def point(px, py):
        c0 = 0.25 * math.exp(_log_normal(px, 0, 1) + _log_normal(py, 0, 1))
        c1 = 0.75 * math.exp(_log_normal(px, 2, 1) + _log_normal(py, 0, 2))
        return math.log(c0 + c1)
    assert float(ll[0]) == pytest.approx((point(0, 0) + point(2, 1)) / 2, rel=1e-12)
    # one unit Gaussian: the log density at its mean
    one = mixture_log_likelihood(torch.zeros(1, 1, 1), MixtureParams(torch.zeros(1, 1), torch.zeros(1, 1, 1),
                                                                     torch.ones(1, 1, 1)))
    assert float(one[0]) == pytest.approx(-0.5 * math.log(2 * math.pi))


def _two_cluster_set(g):
    a = torch.randn(60, 2, generator=g, dtype=torch.float64) * 0.5 + torch.tensor([-2.0, 0.0], dtype=torch.float64)
    b = torch.randn(40, 2, generator=g, dtype=torch.float64) * 0.8 + torch.tensor([2.0, 1.0], dtype=torch.float64)
    return torch.cat([a, b])[None]


def test_em_step_matches_scikit_learn_and_increases_the_likelihood():
    sklearn_mixture = pytest.importorskip("sklearn.mixture")
    g = torch.Generator().manual_seed(0)
    x = _two_cluster_set(g)
    params = MixtureParams(torch.log(torch.tensor([[0.5, 0.5]], dtype=torch.float64)),
                           torch.tensor([[[-1.0, 0.5], [1.0, 0.0]]], dtype=torch.float64),
                           torch.tensor([[[1.5, 1.0], [1.0, 2.0]]], dtype=torch.float64))
    new = em_step(x, params)
    gm = sklearn_mixture.GaussianMixture(2, covariance_type="diag", max_iter=1, weights_init=[0.5, 0.5],
                                         means_init=params.mu[0].numpy(),
                                         precisions_init=(1 / params.sigma[0] ** 2).numpy())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm.fit(x[0].numpy())
    assert torch.allclose(new.log_pi.exp()[0], torch.from_numpy(gm.weights_), atol=1e-10)
    assert torch.allclose(new.mu[0], torch.from_numpy(gm.means_), atol=1e-10)
    assert torch.allclose(new.sigma[0] ** 2, torch.from_numpy(gm.covariances_), atol=1e-10)
    ll0 = float(mixture_log_likelihood(x, params))
    ll1 = float(mixture_log_likelihood(x, new))
    assert ll1 > ll0 + 0.1                             # EM never decreases the likelihood; here it helps a lot
    out = clustering_log_likelihoods(x, params)
    assert out["ll0"] == pytest.approx(ll0) and out["ll1"] == pytest.approx(ll1)


def test_em_step_ignores_padding_and_pools_points_over_sets():
    g = torch.Generator().manual_seed(1)
    x = _two_cluster_set(g)
    params = MixtureParams(torch.zeros(1, 2, dtype=torch.float64),
                           torch.tensor([[[-1.0, 0.0], [1.0, 0.0]]], dtype=torch.float64),
                           torch.ones(1, 2, 2, dtype=torch.float64))
    alone = em_step(x[:, :70], params)
    padded = torch.cat([x, torch.full((1, 5, 2), float("nan"), dtype=torch.float64)], 1)
    mask = torch.zeros(1, padded.shape[1], dtype=torch.bool)
    mask[0, :70] = True
    batched = em_step(padded, params, mask)
    for a, b in zip(alone, batched):
        assert torch.allclose(a, b, atol=1e-12)
    # two sets of 70 and 100 points: each point weighs the same
    both = torch.cat([padded[:, :100], padded[:, :100]])
    m2 = torch.stack([mask[0, :100], torch.ones(100, dtype=torch.bool)])
    p2 = MixtureParams(*(t.expand(2, *t.shape[1:]) for t in params))
    per_set = mixture_log_likelihood(both, p2, m2)
    assert clustering_log_likelihoods(both, p2, m2)["ll0"] == pytest.approx(float(70 * per_set[0] + 100 * per_set[1]) / 170)


def test_mixture_metrics_reject_bad_parameters():
    x = torch.zeros(1, 3, 2)
    good = MixtureParams(torch.zeros(1, 2), torch.zeros(1, 2, 2), torch.ones(1, 2, 2))
    with pytest.raises(ValueError, match="sigma"):
        mixture_log_likelihood(x, MixtureParams(good.log_pi, good.mu, -good.sigma))
    with pytest.raises(ValueError, match="mu"):
        mixture_log_likelihood(x, MixtureParams(good.log_pi, torch.zeros(1, 3, 2), good.sigma))
    with pytest.raises(ValueError, match="x"):
        mixture_log_likelihood(torch.full((1, 3, 2), float("inf")), good)
    with pytest.raises(ValueError, match="mask"):
        mixture_log_likelihood(x, good, torch.zeros(1, 3, dtype=torch.bool))


# ------------------------------------------------------------------------------------------ regression
def test_mae_and_ewt_hand_case():
    pred, target = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 4.0, 0.0])
    assert mean_absolute_error(pred, target) == pytest.approx(5 / 3)
    assert energy_within_threshold(torch.tensor([0.0, 0.01, 0.5]), torch.tensor([0.015, 0.0, 0.0])) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="pred"):
        mean_absolute_error(torch.tensor([float("nan")]), torch.tensor([0.0]))
    with pytest.raises(ValueError, match="shapes"):
        mean_absolute_error(torch.zeros(2), torch.zeros(3))
