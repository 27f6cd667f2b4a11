"""A learned tumble metric in a lone bacterium against one in a swarm, down a narrow valley.

A rotated ellipsoid of condition 1e6 plus 1000 in the box [-5, 5]^10, the black box's
settings in a valley (relative steps, ``metric_rate=2``, no dispersal): a lone bacterium
(``population_size=1``, whose metric follows its evolution path) that does not swim, as
the black box runs it, the same swimming (``swim_length=1``), and a swarm of 8 that swims
(each success counted alone), median error over seeds at a few budgets, the
metric's misfit at the end: the condition number of ``H^(1/2) C H^(1/2)`` (1 when the
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
    ms_per_eval = 1e3 * (time.perf_counter() - started) / int(state.num_evals)
    values = torch.linalg.eigvalsh(root @ state.metric.cov @ root)
    return out, float(values[-1] / values[0]), ms_per_eval


def main() -> None:
    args = parser(__doc__).parse_args()
    dim, seeds = (4, 1) if args.quick else (10, 3)
    budgets = [60 * dim, 125 * dim, 250 * dim, 500 * dim] if args.quick else [
        250 * dim, 500 * dim, 1000 * dim, 2000 * dim]
    rows = {}
    for label, size, swim in (("lone bacterium", 1, 0), ("lone bacterium, swimming", 1, 1),
                              ("swarm of 8", 8, 1)):
        runs = [errors(size, swim, dim, seed, budgets) for seed in range(seeds)]
        rows[label] = {"median_errors": [statistics.median(r[0][i] for r in runs)
                                         for i in range(len(budgets))],
                       "median_misfit": statistics.median(r[1] for r in runs),
                       "median_ms_per_eval": statistics.median(r[2] for r in runs),
                       "runs": runs}
    result = {"quick": args.quick, "machine": machine("cpu"), "dim": dim, "seeds": seeds,
              "budgets": budgets, "rows": rows}
    md = [f"Rotated ellipsoid of condition 1e6 + 1000, D = {dim}, box [-5, 5], metric_rate=2, "
          f"no dispersal; median error over {seeds} seeds after each budget, and the "
          "metric's misfit cond(H^1/2 C H^1/2) at the end (isotropic: 1e6), and the eager "
          "update's wall time per evaluation (the loss itself costs microseconds).", "",
          "| tumbles | " + " | ".join(f"{b} evals" for b in budgets)
          + " | misfit | ms per evaluation |", "|---|" + "---|" * (len(budgets) + 2)]
    for label, row in rows.items():
        md.append(f"| {label} | " + " | ".join(f"{e:.3g}" for e in row["median_errors"])
                  + f" | {row['median_misfit']:.3g} | {row['median_ms_per_eval']:.3g} |")
    write(args, "lone_metric", result, md)


if __name__ == "__main__":
    main()
