"""The chi-square comparison shared by the end-to-end audits."""

from __future__ import annotations

import torch
from scipy.stats import chisquare


def law_pvalue(counts: torch.Tensor, law: torch.Tensor) -> float:
    """p-value of the observed ``counts`` (one per outcome) under the exact ``law``.

    Outcomes whose expected count is below 5 are pooled into one cell, as the test
    needs; the expected counts are scaled to the observed total (float64 rounding only).
    """
    expected = law.to(torch.float64) * counts.sum()
    big = expected >= 5
    observed, wanted = counts[big].to(torch.float64), expected[big]
    if not bool(big.all()):
        observed = torch.cat([observed, counts[~big].sum(0, keepdim=True).to(torch.float64)])
        wanted = torch.cat([wanted, expected[~big].sum(0, keepdim=True)])
    wanted = wanted * observed.sum() / wanted.sum()
    return float(chisquare(observed.numpy(), wanted.numpy()).pvalue)
