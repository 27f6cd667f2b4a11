"""Time one BFO update against the floor: the vmapped evaluation of the same candidates alone.

Also times torch.compile of the update, and of one Threefry call inlined vs as the opaque
custom op that functional_bfo uses (the reason for that design, see docs/design.md).

    python benchmarks/update_overhead.py            # full run
    python benchmarks/update_overhead.py --quick    # ~1 minute smoke run

Writes benchmarks/results/update_overhead.{json,md} with the machine recorded.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import platform
import statistics
import time

import torch

import functional_bfo as fb
from functional_bfo import random as fbr

RESULTS = pathlib.Path(__file__).parent / "results"


def rastrigin(params: dict) -> torch.Tensor:
    x = params["x"] - 0.5
    return 10 * x.numel() + (x.square() - 10 * torch.cos(2 * math.pi * x)).sum()


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def time_update(population: int, dim: int, swim: int, repeats: int) -> dict:
    opt = fb.bfo(population_size=population, swim_length=swim, chemotaxis_steps=10,
                 bounds=(-5.12, 5.12))
    state = opt.update(opt.init({"x": torch.zeros(dim)}, key=fb.random.key(0)), rastrigin)
    candidates = {"x": torch.rand(population, dim) * 10 - 5}
    evaluate = torch.func.vmap(rastrigin)
    floor = median_ms(lambda: [evaluate(candidates) for _ in range(swim + 1)], repeats)
    eager = median_ms(lambda: opt.update(state, rastrigin), repeats)
    torch._dynamo.reset()
    compiled = torch.compile(opt.update, fullgraph=True)
    start = time.perf_counter()
    compiled(state, rastrigin)
    compile_s = time.perf_counter() - start
    fast = median_ms(lambda: compiled(state, rastrigin), repeats)
    return {"population": population, "dim": dim, "swim_length": swim,
            "floor_ms": floor, "eager_ms": eager, "compiled_ms": fast,
            "eager_over_floor": eager / floor, "compiled_over_floor": fast / floor,
            "compile_s": compile_s}


def time_threefry_compile() -> dict:
    """Compile one Threefry call inlined (its 20 rounds as tensor ops) vs as the custom op."""
    key = fbr.key(0)
    counters = torch.arange(64)

    def inlined(k, c):
        return fbr._threefry_rounds(k[0], k[1], c, c + 1)

    def opaque(k, c):
        return fbr.threefry2x32(k, c, c + 1)

    out = {}
    for name, fn in (("inlined", inlined), ("custom_op", opaque)):
        torch._dynamo.reset()
        with torch._inductor.config.patch(fx_graph_cache=False):
            start = time.perf_counter()
            torch.compile(fn, fullgraph=True)(key, counters)
            out[f"threefry_compile_s_{name}"] = time.perf_counter() - start
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a ~1 minute smoke run")
    args = parser.parse_args()
    configs = [(32, 10, 4)] if args.quick else [(32, 10, 4), (256, 30, 4), (64, 1000, 4)]
    repeats = 5 if args.quick else 30
    torch.compile(lambda x: x + 1)(torch.ones(1))  # pay inductor's one-time start-up first
    rows = [time_update(p, d, s, repeats) for p, d, s in configs]
    result = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpus": torch.get_num_threads(), "torch": torch.__version__,
                    "python": platform.python_version()},
        "quick": args.quick,
        "updates": rows,
        **time_threefry_compile(),
    }
    RESULTS.mkdir(exist_ok=True)
    name = "update_overhead_quick" if args.quick else "update_overhead"
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2))
    lines = [f"# Update overhead ({'quick' if args.quick else 'full'} run)", "",
             f"Machine: {result['machine']}", "",
             "| P | D | N_s | floor ms | eager ms | compiled ms | eager/floor | compiled/floor "
             "| compile s |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['population']} | {r['dim']} | {r['swim_length']} | {r['floor_ms']:.3f} | "
              f"{r['eager_ms']:.3f} | {r['compiled_ms']:.3f} | {r['eager_over_floor']:.1f} | "
              f"{r['compiled_over_floor']:.1f} | {r['compile_s']:.1f} |" for r in rows]
    lines += ["", "Compiling one Threefry call: inlined "
              f"{result['threefry_compile_s_inlined']:.1f} s, as the custom op "
              f"{result['threefry_compile_s_custom_op']:.1f} s."]
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
