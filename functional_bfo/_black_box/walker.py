"""A swarm in a valley goes on as one walker: a round of ``lam`` tumbles around one mean.

Each round draws ``x_i = m + sigma (A z_i) width`` and moves the mean to the weighted best
half, as the active (mu/mu_w, lambda)-CMA-ES (Hansen, "The CMA Evolution Strategy: A
Tutorial", 2016); docs/variants.md says why. Ranks only, float64, no host sync.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
from torch import Tensor

from .. import random
from .._base import Key
from .._bounds import LeafBounds, project
from .._metric import TumbleMetric
from .._tree import where

MIN_ROUND = 4  # fewer: the best half is one point (mu_eff 1), and C learns nothing


class Walker(NamedTuple):
    """A walker's state: its mean, step size and metric, and the paths that adapt them."""

    mean: Tensor  # (n,) float64: the centre of its tumbles, unbounded, never evaluated
    sigma: Tensor  # () float64: the step size, in units of width per N(0, I) coordinate
    metric: TumbleMetric  # C (trace n), its factor A, width; path is CMA-ES's p_c
    sigma_path: Tensor  # (n,) float64: CMA-ES's p_sigma
    best_loss: Tensor  # () float64: the best loss it evaluated (its start's before any)
    key: Key
    step: Tensor  # () int64: rounds told
    num_evals: Tensor  # () int64: the evaluations of its swarm and its own

    RANGES = {"sigma": (0.0, math.inf, False)}  # type: ignore[misc]  # a class constant


class Rates(NamedTuple):
    """CMA-ES's weights and learning rates for ``lam`` points in ``n`` dimensions."""

    weights: tuple[float, ...]  # by rank: the best half's sum to 1, the rest's below 0
    mu_eff: float
    c_sigma: float
    d_sigma: float
    c_c: float
    c_1: float
    c_mu: float
    chi_n: float  # E ||N(0, I)||


@functools.cache
def rates(lam: int, n: int, rate: float) -> Rates:
    """The tutorial's defaults (Hansen 2016, Table 1), the learning rates ``rate`` times.

    The worse half's weights are negative (active CMA-ES). ``lam`` >= ``MIN_ROUND``.
    """
    if lam < MIN_ROUND:
        raise ValueError(f"A walker's round needs at least {MIN_ROUND} points, got {lam}.")
    mu = lam // 2
    raw = [math.log((lam + 1) / 2) - math.log(i) for i in range(1, lam + 1)]
    weights, neg = tuple(w / sum(raw[:mu]) for w in raw[:mu]), raw[mu:]
    mu_eff = 1 / sum(w * w for w in weights)
    c_sigma = (mu_eff + 2) / (n + mu_eff + 5)
    d_sigma = 1 + 2 * max(0.0, math.sqrt((mu_eff - 1) / (n + 1)) - 1) + c_sigma
    c_1 = 2 / ((n + 1.3) ** 2 + mu_eff)
    c_mu = min(1 - c_1, 2 * (mu_eff - 2 + 1 / mu_eff) / ((n + 2) ** 2 + mu_eff))
    c_1 = min(rate * c_1, 0.5)
    c_mu = min(1 - c_1, rate * c_mu)
    mu_neg = sum(neg) ** 2 / sum(w * w for w in neg)
    alpha = min(1 + c_1 / c_mu, 1 + 2 * mu_neg / (mu_eff + 2), (1 - c_1 - c_mu) / (n * c_mu))
    weights += tuple(alpha * w / -sum(neg) for w in neg)
    return Rates(weights, mu_eff, c_sigma, d_sigma, (4 + mu_eff / n) / (n + 4 + 2 * mu_eff / n),
                 c_1, c_mu, math.sqrt(n) * (1 - 1 / (4 * n) + 1 / (21 * n * n)))


def start(mean: Tensor, step: Tensor, metric: TumbleMetric, best_loss: Tensor, key: Key,
          num_evals: Tensor) -> Walker:
    """A walker at ``mean`` tumbling as far as a swarm of step size ``step`` (``|z| ~ sqrt(n)``)."""
    return Walker(mean, step.to(torch.float64) / math.sqrt(len(mean)),  # type: ignore[call-arg]
                  metric._replace(path=torch.zeros_like(metric.path)), torch.zeros_like(mean),
                  best_loss.to(torch.float64), key,
                  torch.zeros((), dtype=torch.int64, device=mean.device), num_evals)


def draw(w: Walker, size: int, box: LeafBounds | None, boundary: str) -> tuple[Tensor, Tensor]:
    """A round of ``size`` points: its normal draws ``z`` and the points projected into the box.

    The walker learns from ``z`` as drawn: steps read back from projected points blow up.
    """
    n, m = len(w.mean), w.metric
    z = random.normal(random.fold_in(w.key, w.step), (size * n,), torch.float64).reshape(size, n)
    return z, project(w.mean + w.sigma * (z @ m.factor.T) * m.width, box, boundary)


def told(w: Walker, z: Tensor, costs: Tensor, sign: float, rate: float,
         sigma_range: tuple[float, float], box: LeafBounds | None, boundary: str) -> Walker:
    """The walker after the round ``z`` cost ``costs`` (``sign`` times the losses, float64).

    A round with no finite cost leaves it as it was but for its counts.
    """
    (lam, n), m = z.shape, w.metric
    r = rates(lam, n, rate)
    y = z @ m.factor.T
    ranked, order = torch.sort(costs, stable=True)
    weights = torch.tensor(r.weights, dtype=torch.float64, device=costs.device)
    y_ranked, z_ranked = y.index_select(0, order), z.index_select(0, order)
    positive = weights.clamp_min(0)
    y_w, z_w = positive @ y_ranked, positive @ z_ranked
    # A negative weight's step counts at Mahalanobis length sqrt(n), so C stays positive.
    weights = torch.where(weights >= 0, weights,
                          weights * n / z_ranked.square().sum(1).clamp_min(1e-300))
    sigma_path = ((1 - r.c_sigma) * w.sigma_path
                  + math.sqrt(r.c_sigma * (2 - r.c_sigma) * r.mu_eff) * z_w)
    length = sigma_path.norm()
    # Stalls the rank-one update while p_sigma is long (a step size still growing).
    fade = 1 - (1 - r.c_sigma) ** (2 * (w.step.to(torch.float64) + 1))
    h_sigma = (length / fade.sqrt() < (1.4 + 2 / (n + 1)) * r.chi_n).to(torch.float64)
    path = (1 - r.c_c) * m.path + h_sigma * math.sqrt(r.c_c * (2 - r.c_c) * r.mu_eff) * y_w
    cov = ((1 - r.c_1 - r.c_mu * sum(r.weights)) * m.cov
           + r.c_1 * (torch.outer(path, path) + (1 - h_sigma) * r.c_c * (2 - r.c_c) * m.cov)
           + r.c_mu * (y_ranked.T * weights) @ y_ranked)
    sigma = w.sigma * torch.exp(r.c_sigma / r.d_sigma * (length / r.chi_n - 1))
    # C keeps trace n as every metric does; sigma and p_c take its scale.
    scale = torch.trace(cov) / n
    cov = 0.5 * (cov + cov.T) / scale
    factor, info = torch.linalg.cholesky_ex(cov)
    # The metric stays where rounding left C indefinite, or where the best half's costs tie
    # (a plateau, or the loss's last digit): their order says nothing about the valley.
    mu, seen = sum(weight > 0 for weight in r.weights), torch.isfinite(ranked[0])
    keep = (info != 0) | (ranked[0] == ranked[mu - 1]) | ~seen
    scale = torch.where(keep, 1.0, scale).sqrt()
    low, high = (bound / math.sqrt(n) for bound in sigma_range)
    sigma = (sigma * scale).clamp(low, high)
    # A round whose best ranks tie (a plateau) grows the step to see past it, as pycma's
    # flat-fitness rule does.
    flat = seen & (ranked[0] == ranked[math.ceil(0.1 + lam / 4)])
    sigma = torch.where(flat, (sigma * math.exp(0.2 + r.c_sigma / r.d_sigma)).clamp(low, high),
                        sigma)
    mean, path = w.mean + y_w * w.sigma * m.width, path / scale
    cov, factor = torch.where(keep, m.cov, cov), torch.where(keep, m.factor, factor)
    if box is not None and boundary == "reflect":  # a mirrored mean: its metric and paths too
        odd = torch.remainder(mean - box.low, box.reflect_period) > box.width  # open: NaN
        flip = torch.where(odd, -1.0, 1.0).to(mean)
        cov, factor = flip[:, None] * cov * flip, flip[:, None] * factor * flip
        sigma_path, path = flip * sigma_path, flip * path
    moved = w._replace(
        mean=project(mean, box, boundary), sigma=sigma, sigma_path=sigma_path,
        metric=TumbleMetric(cov, factor, m.width, path),
        best_loss=torch.where(ranked[0] < sign * w.best_loss, sign * ranked[0], w.best_loss))
    held = where(seen, moved, w)  # a round with no finite cost keeps all but its counts
    return held._replace(step=w.step + 1, num_evals=w.num_evals + lam)
