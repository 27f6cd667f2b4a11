"""How an update's cost grows with the population and with the number of parameters.

Eager ``fb.bfo`` / ``fb.adaptive_bfo`` updates on shifted Rastrigin, one sweep over the
population size at 30 parameters and one over the parameter count at population 64:
milliseconds per update, evaluations per second, the update's share over the vmapped
evaluation floor, and the peak memory of one update (on CUDA from the allocator's peak; on
the CPU from the process's peak resident set, each point measured in a fresh process so
that no earlier, larger point's freed memory hides it).

A third sweep finds where chunked evaluation is needed: an MLP whose activations dominate
memory, evaluated whole and with ``fb.evaluate.vmap(chunk_size=...)``; it reports the time
and peak of each, the peak per bacterium, and the population at which an unchunked update
would outgrow the device's memory.

    python benchmarks/scaling.py [--quick] [--device cuda]
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import torch
from common import machine, median_ms, parser, sync, write

import functional_bfo as fb

FACTORIES = {"bfo": fb.bfo, "adaptive_bfo": fb.adaptive_bfo}


def rastrigin(params: dict) -> torch.Tensor:
    x = params["x"] - 0.5
    return 10 * x.numel() + (x.square() - 10 * torch.cos(2 * math.pi * x)).sum()


def _proc_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS: resident now, VmHWM: peak resident)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def peak_mib(run, device: str) -> float | None:
    """Memory one call of ``run`` adds at its peak, in MiB, over what was live before it.

    CUDA: the caching allocator's peak. CPU: the peak resident set (VmHWM, reset through
    /proc/self/clear_refs) over the resident set before the call; only meaningful in a
    process that has not yet freed anything larger (see ``peak_mib_cpu_fresh``).
    """
    sync(device)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        run()
        sync(device)
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident set
    except OSError:
        return None
    base = _proc_kib("VmRSS")
    run()
    return (_proc_kib("VmHWM") - base) / 1024


def peak_mib_cpu_fresh(spec: dict) -> float | None:
    """``peak_mib`` of one CPU update measured in a fresh Python process."""
    out = subprocess.run([sys.executable, __file__, "--child-peak", json.dumps(spec)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _updater(spec: dict, device: str):
    """(initial state, optimizer, loss) for a spec: rastrigin or the chunk-sweep MLP."""
    if spec["problem"] == "rastrigin":
        opt = FACTORIES[spec["variant"]](population_size=spec["population"], swim_length=4,
                                         bounds=(-5.12, 5.12))
        params, loss = {"x": torch.zeros(spec["dim"], device=device)}, rastrigin
    else:
        params, loss = mlp_problem(device)
        opt = fb.bfo(population_size=spec["population"], swim_length=4,
                     evaluator=fb.evaluate.vmap(chunk_size=spec["chunk_size"]))
    return opt.init(params, key=fb.random.key(0)), opt, loss


def _timed(spec: dict, repeats: int, device: str):
    """(state after one update, median ms of an update from it, its peak MiB) for a spec."""
    state, opt, loss = _updater(spec, device)
    state = opt.update(state, loss)
    ms = median_ms(lambda: opt.update(state, loss), repeats, device)
    peak = (peak_mib(lambda: opt.update(state, loss), device) if device.startswith("cuda")
            else peak_mib_cpu_fresh(spec))
    return state, ms, peak


def measure(variant: str, population: int, dim: int, repeats: int, device: str) -> dict:
    spec = {"problem": "rastrigin", "variant": variant, "population": population, "dim": dim}
    state, ms, peak = _timed(spec, repeats, device)
    evaluate = torch.func.vmap(rastrigin)
    candidates = fb.as_params(state, state.population)
    floor = median_ms(lambda: [evaluate(candidates) for _ in range(5)], repeats, device)
    evals = population * 5
    return {"variant": variant, "population": population, "dim": dim, "ms": ms,
            "floor_ms": floor, "over_floor": ms / floor, "evals_per_s": evals / (ms / 1e3),
            "peak_mib": peak}


MLP_WIDTHS, MLP_SAMPLES = (64, 256, 10), 1024


def mlp_problem(device: str):
    """An MLP 64-256-10 on 1024 samples: 1 MiB of hidden activations per bacterium."""
    torch.manual_seed(0)
    a, h, c = MLP_WIDTHS
    model = torch.nn.Sequential(torch.nn.Linear(a, h), torch.nn.Tanh(),
                                torch.nn.Linear(h, c)).to(device)
    x = torch.randn(MLP_SAMPLES, a, device=device)
    y = torch.randint(0, c, (MLP_SAMPLES,), device=device)
    params, module_loss = fb.module_loss(model, torch.nn.functional.cross_entropy)
    return params, lambda p: module_loss(p, x, y)


def device_memory_mib(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.get_device_properties(device).total_memory / 2**20
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20


def measure_chunks(population: int, chunk_size: int | None, repeats: int,
                   device: str) -> dict:
    spec = {"problem": "mlp", "population": population, "chunk_size": chunk_size}
    _, ms, peak = _timed(spec, repeats, device)
    return {"population": population, "chunk_size": chunk_size, "ms": ms, "peak_mib": peak}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child-peak":  # one fresh-process CPU peak
        spec = json.loads(sys.argv[2])
        # Warm up on a tiny problem (loads kernels and lazy state) so that the measured first
        # update's peak is its own working memory, with no larger freed memory to reuse.
        warm, opt, loss = _updater({**spec, "population": 2, "dim": 2}, "cpu")
        opt.update(warm, loss)
        state, opt, loss = _updater(spec, "cpu")
        print(json.dumps(peak_mib(lambda: opt.update(state, loss), "cpu")))
        return
    args = parser(__doc__).parse_args()
    device = args.device
    populations = [16] if args.quick else [16, 64, 256, 1024, 4096]
    dims = [10] if args.quick else [10, 100, 1_000, 10_000, 100_000]
    variants = ["bfo"] if args.quick else ["bfo", "adaptive_bfo"]
    repeats = 3 if args.quick else 10
    rows = [measure(v, p, 30, repeats, device) for v in variants for p in populations]
    rows += [measure(v, 64, d, repeats, device) for v in variants for d in dims]
    chunk_population = 16 if args.quick else 1024
    chunk_sizes = [None, 4] if args.quick else [None, 256, 64, 16]
    chunks = [measure_chunks(chunk_population, c, 3, device) for c in chunk_sizes]
    whole = chunks[0]
    per_bacterium = whole["peak_mib"] / chunk_population if whole["peak_mib"] else None
    capacity = device_memory_mib(device)
    result = {"machine": machine(device), "quick": args.quick, "rows": rows,
              "chunks": chunks, "chunk_peak_mib_per_bacterium": per_bacterium,
              "device_memory_mib": capacity,
              "unchunked_population_limit": (int(capacity / per_bacterium)
                                             if per_bacterium else None)}
    md = [f"# Scaling of one eager update ({'quick' if args.quick else 'full'} run, {device})",
          "", f"Shifted Rastrigin, swim length 4 (5 evaluations per bacterium per update). "
          f"Machine: {result['machine']}", "",
          "| variant | P | D | ms / update | evaluations/s | update / floor | peak MiB |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        peak = "n/a" if r["peak_mib"] is None else f"{r['peak_mib']:.2f}"
        md.append(f"| {r['variant']} | {r['population']} | {r['dim']} | {r['ms']:.2f} | "
                  f"{r['evals_per_s']:,.0f} | {r['over_floor']:.1f} | {peak} |")
    a, h, c = MLP_WIDTHS
    md += ["", f"### Chunked evaluation: MLP {a}-{h}-{c} on {MLP_SAMPLES} samples, "
           f"P = {chunk_population}, fb.bfo, swim length 4", "",
           "| chunk size | ms / update | x unchunked time | peak MiB | x unchunked peak |",
           "|---|---|---|---|---|"]
    for r in chunks:
        peak = "n/a" if r["peak_mib"] is None else f"{r['peak_mib']:.0f}"
        peak_ratio = ("n/a" if not (r["peak_mib"] and whole["peak_mib"])
                      else f"{r['peak_mib'] / whole['peak_mib']:.2f}")
        md.append(f"| {r['chunk_size'] or 'none (whole population)'} | {r['ms']:.1f} | "
                  f"{r['ms'] / whole['ms']:.2f} | {peak} | {peak_ratio} |")
    if per_bacterium:
        md += ["", f"Unchunked, an update peaks at {per_bacterium:.2f} MiB per bacterium for "
               f"this model, so past about {result['unchunked_population_limit']:,} bacteria "
               f"it would outgrow this device's {capacity / 1024:.0f} GiB: that is where "
               "`fb.evaluate.vmap(chunk_size=...)` becomes necessary (peak memory scales with "
               "the chunk, not the population)."]
    write(args, "scaling", result, md)


if __name__ == "__main__":
    main()
