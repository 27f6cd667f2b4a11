"""How an update's cost grows with the population and with the number of parameters.

Eager ``fb.bfo`` / ``fb.adaptive_bfo`` on shifted Rastrigin, over P at D = 30 and over D at
P = 64: ms an update, evaluations/s, update / vmapped-evaluation floor and the peak memory of
an update (CUDA: the allocator's; CPU: the peak resident set in a fresh process, where no
larger freed memory hides it). Then an MLP whose activations dominate memory, whole and with
``fb.evaluate.vmap(chunk_size=...)``, and the population past which an unchunked update
would outgrow the device's memory.

    python benchmarks/scaling.py [--quick] [--device cuda]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
from common import median_ms, parse, peak_mb, table, write
from problems import FACTORIES, mlp_problem, rastrigin_problem

import functional_bfo as fb

MLP_WIDTHS, MLP_SAMPLES = (64, 256, 10), 1024  # 1 MiB of hidden activations per bacterium


def _proc_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS: resident now, VmHWM: peak resident)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def peak_mib(run) -> float | None:
    """Memory one call of ``run`` adds at its peak on the CPU, in MiB: the peak resident set
    (VmHWM, reset through /proc/self/clear_refs) over the resident set before the call; only
    meaningful in a process that has not yet freed anything larger (``--child-peak``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident set
    except OSError:
        return None
    base = _proc_kib("VmRSS")
    run()
    return (_proc_kib("VmHWM") - base) / 1024


def _updater(spec: dict, device: str):
    """(initial state, optimizer, loss) for a spec: rastrigin or the chunk-sweep MLP."""
    if spec["problem"] == "rastrigin":
        params, loss, box = rastrigin_problem(spec["dim"], device)
        opt = FACTORIES[spec["variant"]](population_size=spec["population"], swim_length=4, **box)
    else:
        params, loss, _ = mlp_problem(MLP_WIDTHS, MLP_SAMPLES, device)
        opt = fb.bfo(population_size=spec["population"], swim_length=4,
                     evaluator=fb.evaluate.vmap(chunk_size=spec["chunk_size"]))
    return opt.init(params, key=fb.random.key(0)), opt, loss


def _timed(spec: dict, repeats: int, device: str):
    """(state after one update, median ms of an update from it, its peak MiB) for a spec; the
    CPU's peak in a fresh Python process."""
    state, opt, loss = _updater(spec, device)
    state = opt.update(state, loss)
    ms = median_ms(lambda: opt.update(state, loss), repeats, device)
    if device.startswith("cuda"):
        return state, ms, peak_mb(lambda: opt.update(state, loss), device)
    child = subprocess.run([sys.executable, __file__, "--child-peak", json.dumps(spec)],
                           capture_output=True, text=True, check=True)
    return state, ms, json.loads(child.stdout.strip().splitlines()[-1])


def measure(variant: str, population: int, dim: int, repeats: int, device: str) -> dict:
    spec = {"problem": "rastrigin", "variant": variant, "population": population, "dim": dim}
    state, ms, peak = _timed(spec, repeats, device)
    evaluate = torch.func.vmap(rastrigin_problem(dim, device)[1])
    candidates = fb.as_params(state, state.population)
    floor = median_ms(lambda: [evaluate(candidates) for _ in range(5)], repeats, device)
    return {"variant": variant, "population": population, "dim": dim, "ms": ms,
            "floor_ms": floor, "over_floor": ms / floor,
            "evals_per_s": population * 5 / (ms / 1e3), "peak_mib": peak}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child-peak":  # one fresh-process CPU peak
        spec = json.loads(sys.argv[2])
        # Warm up on a tiny problem (loads kernels and lazy state) so that the measured first
        # update's peak is its own working memory, with no larger freed memory to reuse.
        warm, opt, loss = _updater({**spec, "population": 2, "dim": 2}, "cpu")
        opt.update(warm, loss)
        state, opt, loss = _updater(spec, "cpu")
        print(json.dumps(peak_mib(lambda: opt.update(state, loss))))
        return
    args = parse(__doc__)
    device = args.device
    populations, dims = ([16], []) if args.quick else ([16, 64, 256, 1024, 4096],
                                                       [10, 100, 1_000, 10_000, 100_000])
    variants, repeats = (["bfo"], 3) if args.quick else (["bfo", "adaptive_bfo"], 10)
    rows = [measure(v, p, 30, repeats, device) for v in variants for p in populations]
    rows += [measure(v, 64, d, repeats, device) for v in variants for d in dims]
    chunk_population = 16 if args.quick else 1024
    chunks = []
    for c in [None, 4] if args.quick else [None, 256, 64, 16]:
        spec = {"problem": "mlp", "population": chunk_population, "chunk_size": c}
        _, ms, peak = _timed(spec, 3, device)
        chunks.append({**spec, "ms": ms, "peak_mib": peak})
    whole = chunks[0]
    per_bacterium = whole["peak_mib"] / chunk_population if whole["peak_mib"] else None
    capacity = (torch.cuda.get_device_properties(device).total_memory if device.startswith("cuda")
                else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) / 2**20
    result = {"rows": rows, "chunks": chunks, "chunk_peak_mib_per_bacterium": per_bacterium,
              "device_memory_mib": capacity, "unchunked_population_limit": (
                  int(capacity / per_bacterium) if per_bacterium else None)}
    md = [f"# Scaling of one eager update ({device})", "", "Shifted Rastrigin, swim length 4 "
          "(5 evaluations per bacterium per update).", ""]
    md += table("variant | P | D | ms / update | evaluations/s | update / floor | peak MiB", [
        [r["variant"], r["population"], r["dim"], f"{r['ms']:.2f}", f"{r['evals_per_s']:,.0f}",
         f"{r['over_floor']:.1f}", "n/a" if r["peak_mib"] is None else f"{r['peak_mib']:.2f}"]
        for r in rows])
    md += ["", f"Chunked evaluation: MLP {'-'.join(map(str, MLP_WIDTHS))} on {MLP_SAMPLES} "
           f"samples, P = {chunk_population}, fb.bfo, swim length 4:", ""]
    md += table("chunk size | ms / update | x unchunked time | peak MiB | x unchunked peak", [
        [r["chunk_size"] or "none (whole population)", f"{r['ms']:.1f}",
         f"{r['ms'] / whole['ms']:.2f}", "n/a" if r["peak_mib"] is None else
         f"{r['peak_mib']:.0f}", f"{r['peak_mib'] / whole['peak_mib']:.2f}"
         if r["peak_mib"] and whole["peak_mib"] else "n/a"] for r in chunks])
    if per_bacterium:
        md += ["", f"Unchunked, an update peaks at {per_bacterium:.2f} MiB per bacterium for "
               f"this model, so past about {result['unchunked_population_limit']:,} bacteria "
               f"it would outgrow this device's {capacity / 1024:.0f} GiB: that is where "
               "`fb.evaluate.vmap(chunk_size=...)` becomes necessary (peak memory scales with "
               "the chunk, not the population)."]
    write(args, "scaling", result, md)


if __name__ == "__main__":
    main()
