"""fb.black_box against pycma's BIPOP-CMA-ES: evaluations per second and error, equal budgets.

D = 10, cheap losses (a shifted sphere, Rastrigin, a rotated ellipsoid of condition 1e6), each
plus a constant (a user's loss has no minimum at 0), box [-5, 5], 1000 D evaluations. Per seed,
``fb.black_box`` (torch losses) and ``cma.fmin2(..., bipop=True)`` (numpy losses, from the box's
centre with a step of 0.3 box widths) run in turn; the table has the medians over seeds of
evaluations per second, of the error ``f - min f`` and of the share of fb's evaluations asked in
rounds of at least a whole swarm (what a caller who scores a round in parallel gets in
parallel). Without ``cma`` (``pip install cma``) its columns are empty.

    python benchmarks/black_box_speed.py [--quick]
"""

from __future__ import annotations

import importlib.util
import math
import statistics
import time

import numpy as np
import torch
from common import parse, table, timed, write

import functional_bfo as fb

DIM, LOW, HIGH, OFFSET = 10, -5.0, 5.0, 100.0
WHOLE = 8 * (1 + 1)  # the candidates of a whole swarm's round, at black_box's defaults


def problems(dim: int) -> dict:
    """name -> (torch loss of {"x": (D,)}, numpy loss of a (D,) array); each min is OFFSET."""
    shift = np.linspace(-2.0, 2.0, dim)
    rotation = np.linalg.qr(np.random.default_rng(0).standard_normal((dim, dim)))[0]
    scale = 1e6 ** (np.arange(dim) / (dim - 1))
    t_shift, t_rotation, t_scale = (torch.tensor(a) for a in (shift, rotation, scale))
    forms = {"sphere": lambda z, xp, *_: (z * z).sum(),  # of z = x - shift, numpy's or torch's
             "rastrigin": lambda z, xp, *_: 10 * dim + (z * z - 10 * xp.cos(2 * math.pi * z)).sum(),
             "rotated ellipsoid": lambda z, xp, r, s: (s * (r @ z) ** 2).sum()}
    return {name: (lambda p, f=f: f(p["x"] - t_shift, torch, t_rotation, t_scale) + OFFSET,
                   lambda x, f=f: float(f(np.asarray(x) - shift, np, rotation, scale)) + OFFSET)
            for name, f in forms.items()}


def run_fb(loss, budget: int, seed: int) -> dict:
    """One ``fb.black_box`` run, driven round by round to count the whole-swarm rounds."""
    search = fb.black_box_search((LOW, HIGH), max_evals=budget)
    start = time.perf_counter()
    state = search.init({"x": torch.zeros(DIM, dtype=torch.float64)}, key=fb.random.key(seed))
    whole = 0
    while state.phase != "done":
        before = int(state.num_evals)
        state = search.update(state, loss)
        spent = int(state.num_evals) - before
        whole += spent if spent >= WHOLE else 0
    seconds, evals = time.perf_counter() - start, int(state.num_evals)
    return {"evals_per_s": evals / seconds, "error": float(state.best_loss) - OFFSET,
            "whole_share": whole / evals}


def run_cma(loss, budget: int, seed: int) -> dict:
    import cma

    seen: list[float] = []  # every value: the run's best (es.result: the last restart's)
    _, seconds = timed(lambda: cma.fmin2(
        lambda x: seen.append(loss(x)) or seen[-1], DIM * [0.0], 0.3 * (HIGH - LOW), {
            "bounds": [LOW, HIGH], "maxfevals": budget, "verbose": -9, "seed": seed + 1},
        bipop=True, restarts=9))
    return {"evals_per_s": len(seen) / seconds, "error": min(seen) - OFFSET}


def main() -> None:
    args = parse(__doc__, cpu=True)
    peer = importlib.util.find_spec("cma") is not None
    budget, seeds = (1000, [0]) if args.quick else (1000 * DIM, [0, 1, 2, 3, 4])
    rows = []
    for name, (loss_t, loss_np) in problems(DIM).items():
        runs = [(run_fb(loss_t, budget, s), run_cma(loss_np, budget, s) if peer else None)
                for s in seeds]
        row = {"problem": name, "fb": {k: statistics.median(r[0][k] for r in runs)
                                       for k in runs[0][0]}}
        if peer:
            row["cma"] = {k: statistics.median(r[1][k] for r in runs) for k in runs[0][1]}
            row["ratio"] = statistics.median(r[0]["evals_per_s"] / r[1]["evals_per_s"]
                                             for r in runs)
        rows.append(row)
    md = [f"# fb.black_box against pycma's BIPOP-CMA-ES ({'quick' if args.quick else 'full'})",
          "", f"D = {DIM}, box [{LOW:g}, {HIGH:g}], {budget} evaluations, medians over "
          f"{len(seeds)} seeds.", ""]
    md += table("problem | fb evals/s | cma evals/s | fb / cma | fb error | cma error | fb "
                "whole-swarm share", [
                    [r["problem"], f"{r['fb']['evals_per_s']:,.0f}",
                     f"{r['cma']['evals_per_s']:,.0f}" if peer else "-",
                     f"{r['ratio']:.2f}x" if peer else "-", f"{r['fb']['error']:.3g}",
                     f"{r['cma']['error']:.3g}" if peer else "-",
                     f"{r['fb']['whole_share']:.0%}"] for r in rows])
    write(args, "black_box_speed", {"dim": DIM, "budget": budget, "seeds": seeds, "rows": rows}, md)


if __name__ == "__main__":
    main()
