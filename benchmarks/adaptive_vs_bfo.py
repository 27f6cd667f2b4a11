"""AdaptiveBFO's defaults against canonical BFO's (Passino's) at equal evaluation budgets.

Median final error over seeds, per function, D=10, budget 2000 x D evaluations, shifted
problems in their usual boxes. Writes benchmarks/results/adaptive_vs_bfo.{json,md}.

    python benchmarks/adaptive_vs_bfo.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import time

import torch
from problems import BOXES, make

import functional_bfo as fb

RESULTS = pathlib.Path(__file__).parent / "results"
FACTORIES = {"bfo": fb.bfo, "adaptive_bfo": fb.adaptive_bfo}


def final_error(factory, name: str, dim: int, seed: int, budget: int) -> float:
    loss, bounds = make(name, dim, seed)
    opt = factory(bounds=bounds)
    state = opt.init({"x": torch.zeros(dim, dtype=torch.float64)}, key=fb.random.key(seed))
    return float(fb.run(opt, state, loss, max_evals=budget).best_loss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 functions, 2 seeds, D=5")
    args = parser.parse_args()
    dim, seeds = (5, 2) if args.quick else (10, 5)
    names = ["sphere", "rastrigin"] if args.quick else list(BOXES)
    budget = 2000 * dim
    started = time.perf_counter()
    table = {}
    for name in names:
        table[name] = {}
        for label, factory in FACTORIES.items():
            errors = [final_error(factory, name, dim, s, budget) for s in range(seeds)]
            table[name][label] = {"median": statistics.median(errors), "errors": errors}
    wins = sum(t["adaptive_bfo"]["median"] < t["bfo"]["median"] for t in table.values())
    result = {"machine": {"platform": platform.platform(), "torch": torch.__version__},
              "dim": dim, "seeds": seeds, "budget": budget, "table": table,
              "adaptive_wins": wins, "functions": len(names),
              "seconds": time.perf_counter() - started}
    RESULTS.mkdir(exist_ok=True)
    stem = "adaptive_vs_bfo_quick" if args.quick else "adaptive_vs_bfo"
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2))
    lines = [f"# AdaptiveBFO vs canonical BFO (defaults), D={dim}, {budget} evaluations, "
             f"median of {seeds} seeds", "",
             "| function | bfo median error | adaptive_bfo median error | ratio |",
             "|---|---|---|---|"]
    for name, t in table.items():
        b, a = t["bfo"]["median"], t["adaptive_bfo"]["median"]
        lines.append(f"| {name} | {b:.3g} | {a:.3g} | {a / b if b else float('nan'):.2g} |")
    lines += ["", f"adaptive_bfo has the lower median on {wins} of {len(names)} functions "
              f"({result['seconds']:.0f} s on {result['machine']['platform']})."]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
