"""Evaluation's metrics come from libraries (torchmetrics' AUC, torchrec.metrics' NE) and agree with the
definitions: AUC with the rank-sum formula the runner computed by hand before (ties counting half), NE with the log
loss over the entropy of the positive rate."""

from __future__ import annotations

import math

import pytest
import torch


def _rank_sum_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """The rank-sum AUC, tied scores given their mean rank."""
    order = torch.argsort(scores)
    ranks = torch.empty_like(scores, dtype=torch.float64)
    ranks[order] = torch.arange(1, scores.numel() + 1, dtype=torch.float64)
    uniq, inverse = torch.unique(scores, return_inverse=True)
    sums = torch.zeros(uniq.numel(), dtype=torch.float64).index_add_(0, inverse, ranks)
    counts = torch.zeros(uniq.numel(), dtype=torch.float64).index_add_(0, inverse, torch.ones_like(ranks))
    ranks = (sums / counts)[inverse]
    pos = int(labels.sum())
    neg = labels.numel() - pos
    return float((ranks[labels > 0.5].sum() - pos * (pos + 1) / 2) / (pos * neg))


@pytest.mark.parametrize("seed", range(5))
def test_auc_and_ne_agree_with_their_definitions(seed: int) -> None:
    from runner.train.evaluate import binary_metrics

    g = torch.Generator().manual_seed(seed)
    labels = (torch.rand(4000, generator=g) < 0.1 + 0.15 * seed).double()
    scores = (labels * (0.3 * seed) + torch.randn(4000, generator=g, dtype=torch.float64))  # informative logits
    m = binary_metrics(scores, labels)
    assert m["auc"] == pytest.approx(_rank_sum_auc(scores, labels), abs=1e-6)  # torchmetrics sums in float32
    p = float(labels.mean())
    entropy = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    assert m["ne"] == pytest.approx(m["logloss"] / entropy, rel=1e-6)
    constant = torch.full_like(scores, math.log(p / (1 - p)))  # always the positive rate: NE 1 by definition
    assert binary_metrics(constant, labels)["ne"] == pytest.approx(1.0, rel=1e-9)
    assert math.isnan(binary_metrics(scores, torch.zeros_like(labels))["auc"])  # one class: no AUC
    tied = torch.round(scores)  # a few distinct values, as bf16 logits have: ties count half, in any order
    assert binary_metrics(tied, labels)["auc"] == pytest.approx(_rank_sum_auc(tied, labels), abs=1e-6)
    flat = torch.zeros(4, dtype=torch.float64)
    for order in ([0.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]):
        assert binary_metrics(flat, torch.tensor(order, dtype=torch.float64))["auc"] == 0.5
