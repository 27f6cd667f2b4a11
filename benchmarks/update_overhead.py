"""Time one BFO update against the floor: the vmapped evaluation of the same candidates alone.

An update of population P with swim length N_s evaluates N_s + 1 batches of P candidates;
the floor is exactly those N_s + 1 ``vmap(loss_fn)`` calls (``vmap(grad_and_value)`` for
hybrid_bfo, which needs the gradients), on the population's candidates, run the same way
as the update (eager, or compiled in the same mode). The ratio update / floor is what the
optimizer itself costs. Problems: 30-D Rastrigin (P=256) and an MLP 64-128-10 on
256 samples (P=64). Modes: eager, ``torch.compile(fullgraph=True)``, and on CUDA also
``mode="reduce-overhead"`` (CUDA graphs). Eager is also timed with ``swim_batch=N_s + 1``
(the whole swim ray in one evaluation call), against both the N_s + 1-call floor and the
floor of those stacked candidates evaluated in one call. On CPU it also times compiling
one Threefry call inlined vs as the opaque op functional_bfo uses, and the block
function on one update's lanes as the tensor reference and as the CPU kernel (numpy; see
docs/design.md).

With ``--baseline ROOT`` it times instead this checkout's core against the ``functional_bfo``
of another checkout ROOT (say ``git worktree add /tmp/old v0.3``; both draw with this
checkout's ``random``), update for update in one process, eager and compiled: the cost of a
change to the update itself.

    python benchmarks/update_overhead.py [--quick] [--device cuda] [--variants bfo,...]
                                         [--baseline ROOT]
"""

from __future__ import annotations

import functools
import pathlib
import subprocess
import time

import optree
import torch
from common import (
    baseline_core,
    compile_cold,
    machine,
    median_ms,
    paired_ms,
    parser,
    peak_bytes,
    sync,
    write,
)
from problems import CYCLE, FACTORIES, mlp_problem, rastrigin_problem

import functional_bfo as fb
from functional_bfo import random as fbr


def call_chained(update, mode: str):
    """``update``, with CUDA graphs told that each call is a new step."""
    if mode != "reduce-overhead":
        return update

    def call(state, loss):
        torch.compiler.cudagraph_mark_step_begin()
        return update(state, loss)

    return call


def cycle(update, state, loss):
    """CYCLE consecutive updates from ``state`` (one reproduction), advancing each call.

    Updates as a user runs them: chained states over a whole reproduction cycle.
    """
    current = [state]

    def run():
        s = current[0]
        for _ in range(CYCLE):
            s = update(s, loss)
        current[0] = s

    return run


def time_update(name: str, variant: str, population: int, problem, repeats: int,
                device: str, modes: list[str]) -> dict:
    params, loss, extra = problem
    swim = 4
    kwargs = dict(population_size=population, swim_length=swim, chemotaxis_steps=CYCLE,
                  **extra)
    if variant == "hybrid_bfo":
        kwargs["grad_mask"] = True
    opt = FACTORIES[variant](**kwargs)
    state = opt.update(opt.init(params, key=fb.random.key(0)), loss)
    candidates = fb.as_params(state, state.population)
    evaluate = torch.func.vmap(torch.func.grad_and_value(loss) if variant == "hybrid_bfo"
                               else loss)
    row = {"problem": name, "variant": variant, "population": population,
           "params": sum(x.numel() for x in params.values()), "swim_length": swim}
    def floor_eager():
        for _ in range(swim + 1):
            evaluate(candidates)

    floor_calls = {"eager": floor_eager}
    for mode in modes[1:]:  # the floor compiled the same way: the fair bar for that mode
        torch.compiler.reset()
        floor = torch.compile(evaluate, fullgraph=True,
                              mode=None if mode == "compiled" else mode)

        def floor_call(floor=floor, mode=mode):
            for _ in range(swim + 1):
                if mode == "reduce-overhead":
                    torch.compiler.cudagraph_mark_step_begin()
                floor(candidates)

        floor_call()
        floor_calls[mode] = floor_call
    for mode in modes:
        if mode == "eager":
            update = opt.update
            compile_s = 0.0
        else:
            torch.compiler.reset()
            update = torch.compile(opt.update, fullgraph=True,
                                   mode=None if mode == "compiled" else mode)
            sync(device)
            start = time.perf_counter()
            update(state, loss)
            update(state, loss)  # reduce-overhead records its CUDA graph on the second call
            sync(device)
            compile_s = time.perf_counter() - start

        def call(update=update, mode=mode):
            if mode == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()
            return update(state, loss)

        # As a user runs them: chained states over a whole reproduction cycle.
        floor_ms, ms, ratio = paired_ms(floor_calls[mode], cycle(call_chained(update, mode),
                                        state, loss), repeats, device, CYCLE)
        row["floor_ms" if mode == "eager" else f"floor_{mode}_ms"] = floor_ms
        row[f"{mode}_ms"] = ms
        row[f"{mode}_over_floor" if mode == "eager" else f"{mode}_over_own_floor"] = ratio
        row[f"{mode}_compile_s"] = compile_s
        row[f"{mode}_evals_per_s"] = population * (swim + 1) / (ms / 1e3)
        # One fixed state timed over and over: the same program, for the gap to the above.
        row[f"{mode}_fixed_state_ms"] = paired_ms(floor_calls[mode], call, repeats, device)[1]
        # On the CPU only eager allocations are seen: inductor's own buffers bypass the
        # profiler's memory events (a compiled mm of two 1000 x 1000 inputs shows half).
        chained = call_chained(update, mode)
        row[f"{mode}_peak_mb"] = (peak_bytes(functools.partial(chained, state, loss), device)
                                  / 2**20 if mode == "eager" or device != "cpu" else None)
    for mode in modes[1:]:
        row[f"{mode}_over_floor"] = row[f"{mode}_ms"] / row["floor_ms"]
    # The memory floor: the population's parameters and one evaluation call's activations.
    row["population_mb"] = sum(x.numel() * x.element_size()
                               for x in optree.tree_leaves(candidates)) / 2**20
    row["floor_peak_mb"] = row["population_mb"] + peak_bytes(
        lambda: evaluate(candidates), device) / 2**20
    if "eager" in modes:  # the whole swim ray in one call: the same trajectory, fewer calls
        ray = FACTORIES[variant](**kwargs, swim_batch=swim + 1)
        ray_state = ray.update(ray.init(params, key=fb.random.key(0)), loss)
        stacked = optree.tree_map(lambda x: x.repeat((swim + 1,) + (1,) * (x.dim() - 1)),
                                  candidates)
        work = cycle(ray.update, ray_state, loss)
        _, row["eager_ray_ms"], row["eager_ray_over_floor"] = paired_ms(
            floor_eager, work, repeats, device, CYCLE)
        row["floor_one_call_ms"], _, row["eager_ray_over_one_call_floor"] = paired_ms(
            lambda: evaluate(stacked), work, repeats, device, CYCLE)
    return row


def time_threefry_compile() -> dict:
    """Compile one Threefry call inlined (its 20 rounds as tensor ops) vs as the opaque op."""
    key = fbr.key(0)
    counters = torch.arange(64)

    def inlined(k, c):
        return fbr._threefry_rounds(k[0], k[1], c, c + 1)

    def opaque(k, c):
        return fbr.threefry2x32(k, c, c + 1)

    out = {}
    for name, fn in (("inlined", inlined), ("op", opaque)):
        torch.compiler.reset()
        with torch._inductor.config.patch(fx_graph_cache=False):
            start = time.perf_counter()
            torch.compile(fn, fullgraph=True)(key, counters)
            out[f"threefry_compile_s_{name}"] = time.perf_counter() - start
    return out


def time_block_functions(repeats: int) -> dict:
    """The block function on an update's lanes: the tensor reference and the CPU kernels."""
    words = (torch.tensor(5), torch.tensor(7), torch.tensor(3))  # key and step counter
    paths = {"tensor": fbr._threefry_rounds, "numpy": fbr._threefry_numpy}
    if fbr.CPU_KERNEL == "c":  # built at install
        paths["c"] = fbr._threefry_c
    out = {}
    # One update's noise: P rows of ceil((2n + 3) / 2) lanes (random.normal_rows).
    for name, rows, n in (("rastrigin-30", 256, 30), ("mlp-64-128-10", 64, 9610)):
        half = n + 2
        lanes = torch.arange(rows).unsqueeze(1) * half + torch.arange(half)
        for path, fn in paths.items():
            out[f"block_ms_{name}_{path}"] = median_ms(functools.partial(fn, *words, lanes),
                                                       repeats)
        out[f"block_lanes_{name}"] = rows * half
    return out


def time_against(base, name: str, variant: str, population: int, problem, repeats: int,
                 device: str) -> dict:
    """Time per update of the baseline's core and ours, eager and compiled, in turn."""
    params, loss, extra = problem
    kwargs = dict(population_size=population, swim_length=4, chemotaxis_steps=CYCLE, **extra)
    if variant == "hybrid_bfo":
        kwargs["grad_mask"] = True
    row = {"problem": name, "variant": variant, "population": population}
    for mode in ("eager", "compiled"):
        runs = []
        for core in (base, fb):
            opt = getattr(core, variant)(**kwargs)
            state = opt.update(opt.init(params, key=core.random.key(0)), loss)
            update = opt.update if mode == "eager" else torch.compile(opt.update,
                                                                      fullgraph=True)
            update(state, loss)
            runs.append(cycle(update, state, loss))
        base_ms, ours_ms, ratio = paired_ms(runs[0], runs[1], repeats, device)
        row[mode] = {"baseline_ms": base_ms / CYCLE, "ours_ms": ours_ms / CYCLE, "ratio": ratio}
    return row


def against(args, problems, variants, repeats) -> None:
    base = baseline_core(args.baseline.resolve())
    commit = subprocess.run(["git", "-C", str(args.baseline), "log", "-1", "--format=%h %s"],
                            capture_output=True, text=True).stdout.strip()[:72]
    rows = [time_against(base, name, v, pop, prob, repeats, args.device)
            for name, pop, prob in problems for v in variants]
    result = {"machine": machine(args.device), "quick": args.quick, "baseline": commit,
              "rows": rows}
    md = [f"# Update time: this checkout's core against a baseline ({args.device})", "",
          f"Machine: {result['machine']}", "", f"Baseline: `{commit}`", "",
          "Per update over runs of chained updates, the two cores timed back to back in one "
          "process; the ratio is the median of per-repeat ratios (ours / baseline).", "",
          "| problem | variant | P | eager baseline ms | eager ours ms | eager ratio | "
          "compiled baseline ms | compiled ours ms | compiled ratio |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        e, c = r["eager"], r["compiled"]
        md.append(f"| {r['problem']} | {r['variant']} | {r['population']} | "
                  f"{e['baseline_ms']:.3f} | {e['ours_ms']:.3f} | {e['ratio']:.3f} | "
                  f"{c['baseline_ms']:.3f} | {c['ours_ms']:.3f} | {c['ratio']:.3f} |")
    write(args, "update_overhead_baseline", result, md)


def main() -> None:
    compile_cold()
    p = parser(__doc__)
    p.add_argument("--variants", default="bfo,adaptive_bfo,hybrid_bfo")
    p.add_argument("--baseline", type=pathlib.Path, help="a checkout whose core to compare")
    args = p.parse_args()
    device = args.device
    variants = ["bfo"] if args.quick else args.variants.split(",")
    modes = ["eager", "compiled"] + (["reduce-overhead"] if device.startswith("cuda") else [])
    repeats = 5 if args.quick else 30
    problems = ([("rastrigin-10", 32, rastrigin_problem(10, device))] if args.quick else
                [("rastrigin-30", 256, rastrigin_problem(30, device)),
                 ("mlp-64-128-10", 64, mlp_problem((64, 128, 10), 256, device))])
    torch.compile(lambda x: x + 1)(torch.ones(1, device=device))  # inductor's start-up
    if args.baseline is not None:
        return against(args, problems, variants, repeats)
    rows = [time_update(name, v, pop, prob, repeats, device, modes)
            for name, pop, prob in problems for v in variants]
    result = {"machine": machine(device), "quick": args.quick, "updates": rows}
    if device == "cpu" and not args.quick:
        result.update(time_threefry_compile())
        result.update(time_block_functions(repeats))
    md = [f"# Update overhead vs the vmapped-evaluation floor "
          f"({'quick' if args.quick else 'full'} run, {device})", "",
          f"Machine: {result['machine']}", "",
          "Each ratio divides by the floor evaluated the same way (eager floor for eager, the "
          "floor compiled in the same mode for compiled modes), as the median of per-repeat "
          "ratios, each repeat timing the floor and the update back to back. The floor is "
          "the N_s + 1 evaluation calls of one population each that an update makes by default. "
          "`eager ray` is the eager update with `swim_batch=N_s + 1` (one call of the "
          "stacked candidates, the same trajectory); `1-call floor` is those stacked "
          "candidates evaluated in one call. Eager times are per update over runs of "
          f"{CYCLE} consecutive updates (one reproduction each).", "",
          "| problem | variant | P | floor ms | " + " | ".join(
              f"{m} ms | {m}/floor" for m in modes)
          + " | eager ray ms | ray/floor | 1-call floor ms | ray/1-call floor | compile s |",
          "|---|---|---|---|" + "---|---|" * len(modes) + "---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['problem']} | {r['variant']} | {r['population']} | "
                  f"{r['floor_ms']:.3f} | " + " | ".join(
                      f"{r[f'{m}_ms']:.3f} | "
                      f"{r.get(f'{m}_over_own_floor', r[f'{m}_over_floor']):.2f}"
                      for m in modes)
                  + f" | {r['eager_ray_ms']:.3f} | {r['eager_ray_over_floor']:.2f} | "
                  f"{r['floor_one_call_ms']:.3f} | {r['eager_ray_over_one_call_floor']:.2f}"
                  f" | {r['compiled_compile_s']:.1f} |")
    md += ["", "Compiled updates timed two ways: chained states over whole reproduction cycles "
           "(the table above, as a user runs them) and one fixed state timed over and over. "
           "Both run the same program (reproduction and dispersal are masked on every update); "
           "a gap comes from the data (chained states move, a fixed state repeats one step's "
           "work and allocations) and from the machine. Peak memory per update (MB, allocations "
           "above what was held before, recorded by torch.profiler on the CPU, the caching "
           "allocator on CUDA) against its floor: the population's parameters plus one "
           "evaluation call's activations. Compiled on the CPU it is not measured (n/a): "
           "inductor's buffers bypass the profiler's memory events.", "",
           "| problem | variant | " + " | ".join(
               f"{m} chained ms | {m} fixed-state ms" for m in modes[1:])
           + " | population MB | floor peak MB | " + " | ".join(
               f"{m} peak MB | {m}/floor" for m in modes) + " |",
           "|---|---|" + "---|---|" * len(modes[1:]) + "---|---|" + "---|---|" * len(modes)]
    for r in rows:
        md.append(f"| {r['problem']} | {r['variant']} | " + " | ".join(
            f"{r[f'{m}_ms']:.3f} | {r[f'{m}_fixed_state_ms']:.3f}" for m in modes[1:])
            + f" | {r['population_mb']:.3f} | {r['floor_peak_mb']:.3f} | " + " | ".join(
                "n/a | n/a" if r[f"{m}_peak_mb"] is None else
                f"{r[f'{m}_peak_mb']:.3f} | {r[f'{m}_peak_mb'] / r['floor_peak_mb']:.2f}"
                for m in modes) + " |")
    if "threefry_compile_s_inlined" in result:
        md += ["", "Compiling one Threefry call: inlined "
               f"{result['threefry_compile_s_inlined']:.1f} s, as the opaque op "
               f"{result['threefry_compile_s_op']:.1f} s."]
    for name in ("rastrigin-30", "mlp-64-128-10"):
        if f"block_lanes_{name}" in result:
            times = ", ".join(f"{path} {result[f'block_ms_{name}_{path}']:.3f} ms"
                              for path in ("tensor", "numpy", "c")
                              if f"block_ms_{name}_{path}" in result)
            md += ["", f"The block function on one {name} update's "
                   f"{result[f'block_lanes_{name}']:,} lanes: {times}."]
    write(args, "update_overhead", result, md)


if __name__ == "__main__":
    main()
