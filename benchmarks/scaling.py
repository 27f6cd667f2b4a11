"""How an update's cost grows with the population and with the number of parameters.

Eager ``fb.bfo`` / ``fb.adaptive_bfo`` updates on shifted Rastrigin, one sweep over the
population size at 30 parameters and one over the parameter count at population 64:
milliseconds per update, evaluations per second, the update's share over the vmapped
evaluation floor, and on CUDA the peak memory of one update.

    python benchmarks/scaling.py [--quick] [--device cuda]
"""

from __future__ import annotations

import math

import torch
from common import machine, median_ms, parser, sync, write

import functional_bfo as fb

FACTORIES = {"bfo": fb.bfo, "adaptive_bfo": fb.adaptive_bfo}


def rastrigin(params: dict) -> torch.Tensor:
    x = params["x"] - 0.5
    return 10 * x.numel() + (x.square() - 10 * torch.cos(2 * math.pi * x)).sum()


def measure(variant: str, population: int, dim: int, repeats: int, device: str) -> dict:
    opt = FACTORIES[variant](population_size=population, swim_length=4,
                             bounds=(-5.12, 5.12))
    state = opt.init({"x": torch.zeros(dim, device=device)}, key=fb.random.key(0))
    state = opt.update(state, rastrigin)
    evaluate = torch.func.vmap(rastrigin)
    floor = median_ms(lambda: [evaluate(state.population) for _ in range(5)], repeats, device)
    if device.startswith("cuda"):
        sync(device)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    ms = median_ms(lambda: opt.update(state, rastrigin), repeats, device)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if device.startswith(
        "cuda") else None
    evals = population * 5
    return {"variant": variant, "population": population, "dim": dim, "ms": ms,
            "floor_ms": floor, "over_floor": ms / floor, "evals_per_s": evals / (ms / 1e3),
            "peak_mib": peak}


def main() -> None:
    args = parser(__doc__).parse_args()
    device = args.device
    populations = [16, 64, 256] if args.quick else [16, 64, 256, 1024, 4096]
    dims = [10, 100] if args.quick else [10, 100, 1_000, 10_000, 100_000]
    variants = ["bfo"] if args.quick else ["bfo", "adaptive_bfo"]
    repeats = 3 if args.quick else 10
    rows = [measure(v, p, 30, repeats, device) for v in variants for p in populations]
    rows += [measure(v, 64, d, repeats, device) for v in variants for d in dims]
    result = {"machine": machine(device), "quick": args.quick, "rows": rows}
    md = [f"# Scaling of one eager update ({'quick' if args.quick else 'full'} run, {device})",
          "", f"Shifted Rastrigin, swim length 4 (5 evaluations per bacterium per update). "
          f"Machine: {result['machine']}", "",
          "| variant | P | D | ms / update | evaluations/s | update / floor | peak MiB |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        peak = "n/a" if r["peak_mib"] is None else f"{r['peak_mib']:.1f}"
        md.append(f"| {r['variant']} | {r['population']} | {r['dim']} | {r['ms']:.2f} | "
                  f"{r['evals_per_s']:,.0f} | {r['over_floor']:.1f} | {peak} |")
    write(args, "scaling", result, md)


if __name__ == "__main__":
    main()
