"""A learned tumble metric in the black box's walker, a lone bacterium and a swarm, down a valley.

A rotated ellipsoid of condition 1e6 plus 1000 in the box [-5, 5]^10, the black box's
settings in a valley (relative steps, ``metric_rate=2``, no dispersal): the walker the black
box goes on with (``functional_bfo._walker``: 16 tumbles a round around a mean, the best
half recombined, as a swarm of 8 that swims asks for), a lone bacterium
(``population_size=1``, whose metric follows its evolution path) that does not swim, the
same swimming (``swim_length=1``), and a swarm of 8 that swims (each success counted
alone), all from the box's centre at step 0.1, median error over seeds at a few budgets, the
metric's misfit after 250 D evaluations: the condition number of ``H^(1/2) C H^(1/2)``
(1 when the
metric is the inverse Hessian ``H^-1``, 1e6 when isotropic), and the wall time of an eager
update per evaluation (this loss costs microseconds, so it is the update's own cost).
Writes ``results/lone_metric.{json,md}``.

    python benchmarks/lone_metric.py [--quick]
"""

from __future__ import annotations

import statistics
import time

import torch
from common import machine, parser, write

import functional_bfo as fb
from functional_bfo._black_box import walker as _walker
from functional_bfo._bounds import check_bounds, flat_box
from functional_bfo._layout import layout
from functional_bfo._metric import isotropic

WALKER_ROUND = 16
# The misfit is read after budgets[MISFIT_AT] (250 D), while all descend: at the floor
# the losses differ by rounding alone, and the walker's metric learns from their noise.
MISFIT_AT = 0


def valley(dim: int, seed: int):
    """The loss, and the square root of its Hessian (in box widths of 10)."""
    g = torch.Generator().manual_seed(seed)
    rotation = torch.linalg.qr(torch.randn(dim, dim, generator=g, dtype=torch.float64))[0]
    scales = 10 ** (6 * torch.arange(dim, dtype=torch.float64) / (dim - 1))
    optimum = torch.rand(dim, generator=g, dtype=torch.float64) * 8 - 4

    def loss(p):
        z = (p["x"] - optimum) @ rotation.T
        return (scales * z * z).sum() + 1000.0

    return loss, rotation.T @ torch.diag(10 * scales.sqrt()) @ rotation


def errors(size: int, swim: int, dim: int, seed: int, budgets: list[int]
           ) -> tuple[list[float], float, float]:
    """The errors after each budget, the metric's misfit, and milliseconds per evaluation."""
    loss, root = valley(dim, seed)
    opt = fb.adaptive_bfo(size, bounds=(-5.0, 5.0), relative_steps=True, swim_length=swim,
                          step_size_min=1e-12, metric_rate=2.0, elimination_prob=0.0,
                          elimination_prob_max=0.0)
    state = opt.init({"x": torch.zeros(dim, dtype=torch.float64)}, key=fb.random.key(seed))
    out, started = [], time.perf_counter()
    for budget in budgets:
        while int(state.num_evals) + (swim + 1) * size <= budget:
            state = opt.update(state, loss)
        out.append(float(state.best_loss) - 1000.0)
        if budget == budgets[MISFIT_AT]:
            misfit = _misfit(root, state.metric.cov)
    return out, misfit, 1e3 * (time.perf_counter() - started) / int(state.num_evals)


def walker_errors(dim: int, seed: int, budgets: list[int]) -> tuple[list[float], float, float]:
    """``errors`` for the walker, with the black box's settings (rate 2, steps 1e-12 to 1)."""
    loss, root = valley(dim, seed)
    x = torch.zeros(dim, dtype=torch.float64)
    box = flat_box(check_bounds((-5.0, 5.0)), layout({"x": x}), x.device, torch.float64)
    w = _walker.start(x, torch.tensor(0.1, dtype=torch.float64), isotropic(box.width.expand(dim)),
                      torch.tensor(float("inf"), dtype=torch.float64), fb.random.key(seed),
                      torch.tensor(0))
    out, started = [], time.perf_counter()
    for budget in budgets:
        while int(w.num_evals) + WALKER_ROUND <= budget:
            z, rows = _walker.draw(w, WALKER_ROUND, box, "reflect")
            losses = torch.vmap(lambda r: loss({"x": r}))(rows)
            w = _walker.told(w, z, losses, 1.0, 2.0, (1e-12, 1.0), box, "reflect")
        out.append(float(w.best_loss) - 1000.0)
        if budget == budgets[MISFIT_AT]:
            misfit = _misfit(root, w.metric.cov)
    return out, misfit, 1e3 * (time.perf_counter() - started) / int(w.num_evals)


def _misfit(root: torch.Tensor, cov: torch.Tensor) -> float:
    """cond(H^1/2 C H^1/2): 1 where the metric is the inverse Hessian."""
    values = torch.linalg.eigvalsh(root @ cov @ root)
    return float(values[-1] / values[0])


def main() -> None:
    args = parser(__doc__).parse_args()
    dim, seeds = (4, 1) if args.quick else (10, 3)
    budgets = [60 * dim, 125 * dim, 250 * dim, 500 * dim] if args.quick else [
        250 * dim, 500 * dim, 1000 * dim, 2000 * dim]
    rows = {}
    for label, size, swim in (("walker, 16 a round", 0, 0), ("lone bacterium", 1, 0),
                              ("lone bacterium, swimming", 1, 1), ("swarm of 8", 8, 1)):
        runs = [walker_errors(dim, seed, budgets) if label.startswith("walker") else
                errors(size, swim, dim, seed, budgets) for seed in range(seeds)]
        rows[label] = {"median_errors": [statistics.median(r[0][i] for r in runs)
                                         for i in range(len(budgets))],
                       "median_misfit": statistics.median(r[1] for r in runs),
                       "median_ms_per_eval": statistics.median(r[2] for r in runs),
                       "runs": runs}
    result = {"quick": args.quick, "machine": machine("cpu"), "dim": dim, "seeds": seeds,
              "budgets": budgets, "rows": rows}
    md = [f"# A learned metric down a rotated valley ({'quick' if args.quick else 'full'})", "",
          f"Rotated ellipsoid of condition 1e6 + 1000, D = {dim}, box [-5, 5], metric_rate=2, "
          f"no dispersal; median error over {seeds} seeds after each budget, the metric's "
          f"misfit cond(H^1/2 C H^1/2) after {budgets[MISFIT_AT]} (isotropic: 1e6), and the eager "
          "update's wall time per evaluation (the loss itself costs microseconds).", "",
          "| tumbles | " + " | ".join(f"{b} evals" for b in budgets)
          + f" | misfit at {budgets[MISFIT_AT]} | ms per evaluation |",
          "|---|" + "---|" * (len(budgets) + 2)]
    for label, row in rows.items():
        md.append(f"| {label} | " + " | ".join(f"{e:.3g}" for e in row["median_errors"])
                  + f" | {row['median_misfit']:.3g} | {row['median_ms_per_eval']:.3g} |")
    write(args, "lone_metric", result, md)


if __name__ == "__main__":
    main()
