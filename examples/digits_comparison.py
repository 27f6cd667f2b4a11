"""HybridBFO vs canonical BFO vs AdaptiveBFO vs Adam on scikit-learn's digits (64-32-10 MLP).

Every method gets the same number of loss evaluations on the full training set (an Adam
step is one evaluation with its gradient; a hybrid evaluation also yields its gradient).
Prints a table and writes docs/figures/digits_comparison.png: best training loss against
evaluations and against wall time. Needs `pip install -e ".[docs]"`; about 30 s on a CPU.

    python examples/digits_comparison.py
"""

from __future__ import annotations

import pathlib
import time

import matplotlib
import torch
from sklearn.datasets import load_digits
from torch import nn

import functional_bfo as fb

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

BUDGET = 6000  # loss evaluations per method
FIGURE = pathlib.Path(__file__).parents[1] / "docs" / "figures" / "digits_comparison.png"


def data():
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    return x[order[:1400]], y[order[:1400]], x[order[1400:]], y[order[1400:]]


def run_bfo(name, opt, params, loss_fn, x, y):
    curve = []
    state = opt.init(params, key=fb.random.key(0))
    state = fb.run(opt, state, loss_fn, x, y, max_evals=BUDGET, log_every=1,
                   progress=lambda i: curve.append((i["num_evals"], i["seconds"], i["best_loss"])))
    return name, state.best_params, curve


def run_adam(params, loss_fn, x, y):
    p = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    adam = torch.optim.Adam(p.values(), lr=1e-2)
    curve, best, start = [], float("inf"), time.perf_counter()
    for step in range(1, BUDGET + 1):
        adam.zero_grad()
        loss = loss_fn(p, x, y)
        loss.backward()
        adam.step()
        best = min(best, loss.item())
        curve.append((step, time.perf_counter() - start, best))
    return "Adam (lr 1e-2)", {k: v.detach() for k, v in p.items()}, curve


def main() -> None:
    x_train, y_train, x_test, y_test = data()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))
    params, loss_fn = fb.module_loss(model, nn.functional.cross_entropy)
    shared = dict(population_size=8, step_size=0.5, step_size_max=5.0, init_scale=0.1)
    runs = [
        run_bfo("HybridBFO (w=0.7)", fb.hybrid_bfo(gradient_weight=0.7, grad_mask=True,
                                                   **shared), params, loss_fn, x_train, y_train),
        run_bfo("AdaptiveBFO", fb.adaptive_bfo(**shared), params, loss_fn, x_train, y_train),
        run_bfo("canonical BFO", fb.bfo(population_size=8, step_size=0.05, chemotaxis_steps=10,
                                        init_scale=0.1), params, loss_fn, x_train, y_train),
        run_adam(params, loss_fn, x_train, y_train),
    ]
    fig, (by_evals, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    print(f"{'method':22s} {'train loss':>10s} {'test acc':>9s} {'seconds':>8s}")
    for name, best, curve in runs:
        evals, seconds, losses = zip(*curve)
        accuracy = (torch.func.functional_call(model, best, (x_test,)).argmax(1) == y_test)
        print(f"{name:22s} {losses[-1]:10.4f} {accuracy.float().mean():9.1%} {seconds[-1]:8.1f}")
        by_evals.plot(evals, losses, label=name)
        by_time.plot(seconds, losses, label=name)
    for ax, xlabel in ((by_evals, "loss evaluations"), (by_time, "wall time (s)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("best training cross-entropy")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    by_evals.legend()
    fig.suptitle(f"digits, 64-32-10 MLP, {BUDGET} evaluations each (CPU)")
    fig.tight_layout()
    FIGURE.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(FIGURE, dpi=110)
    print(f"wrote {FIGURE}")


if __name__ == "__main__":
    main()
