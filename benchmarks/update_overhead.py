"""Time one BFO update against the floor: the vmapped evaluation of the same candidates alone.

An update with swim length N_s evaluates N_s + 1 batches of P candidates; the floor is exactly
those N_s + 1 ``vmap(loss_fn)`` calls (``vmap(grad_and_value)`` for hybrid_bfo), run as the
update is (eager, or compiled alike): update / floor is what the optimizer itself costs. A
30-D Rastrigin (P = 256) and an MLP 64-128-10 on 256 samples (P = 64), eager,
``torch.compile(fullgraph=True)`` and on CUDA ``mode="reduce-overhead"``; eager also with
``swim_batch=N_s + 1`` (the whole ray in one call) against both floors; the peak memory of an
eager update against the population plus one call.

``--baseline ROOT`` times instead this checkout's core against another checkout's (say ``git
worktree add /tmp/old v0.3``; both draw with this checkout's ``random``), update for update in
one process, eager and compiled: the cost of a change to the update itself.

``--first-compile`` (record ``first_compile``, CPU): the first compiled update in fresh processes,
in new empty inductor folders (``TMPDIR``, ``TORCHINDUCTOR_CACHE_DIR``): a one-op program first
(inductor's start-up on a new machine), then each variant's update and the shell's first step
(``BFO(compile=True)``, ``adapter_paths.py``'s MLP) unseen (cold) and in a second process (warm);
seconds, inductor's CPU probe and Dynamo's tracing among them; again with
``TORCHINDUCTOR_VEC_ISA_OK=1``.

    python benchmarks/update_overhead.py [--quick] [--device cuda]
                                         [--baseline ROOT | --first-compile]
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

import optree
import torch
from adapter_paths import BFO, stepper
from common import baseline, compiled, paired_ms, parse, peak_mb, table, timed, write
from problems import CYCLE, SWIM, cycle, evaluation, mlp, mlp_problem, rastrigin_problem, started

import functional_bfo as fb

VARIANTS = ["bfo", "adaptive_bfo", "hybrid_bfo"]  # hybrid_bfo with grad_mask=True


def time_update(name: str, variant: str, population: int, problem, repeats: int,
                device: str, modes: list[str]) -> dict:
    loss = problem[1]
    opt, state = started(variant, population, problem)
    candidates = fb.as_params(state, state.population)
    evaluate = evaluation(variant, loss)
    row = {"problem": name, "variant": variant, "population": population,
           "params": sum(x.numel() for x in problem[0].values()), "swim_length": SWIM}
    for mode in modes:
        torch.compiler.reset()
        floor_fn = compiled(evaluate, mode)

        def floor(floor_fn=floor_fn, mode=mode):  # the fair bar: compiled the same way
            for _ in range(SWIM + 1):
                if mode == "reduce-overhead":
                    torch.compiler.cudagraph_mark_step_begin()
                floor_fn(candidates)

        floor()
        update = compiled(opt.update, mode)
        # Compiles; reduce-overhead records its CUDA graph on the second call.
        _, took = timed(lambda update=update: [update(state, loss) for _ in range(2)], device)
        row[f"{mode}_compile_s"] = 0.0 if mode == "eager" else took
        work = cycle(update, state, loss, clone=mode == "reduce-overhead")
        floor_ms, ms, ratio = paired_ms(floor, work, repeats, device, CYCLE)
        row["floor_ms" if mode == "eager" else f"floor_{mode}_ms"] = floor_ms
        row[f"{mode}_ms"] = ms
        row[f"{mode}_over_floor" if mode == "eager" else f"{mode}_over_own_floor"] = ratio
        row[f"{mode}_evals_per_s"] = population * (SWIM + 1) / (ms / 1e3)
        if mode == "eager" or device != "cpu":  # inductor's CPU buffers bypass the profiler
            row[f"{mode}_peak_mb"] = peak_mb(functools.partial(update, state, loss), device)
    for mode in modes[1:]:
        row[f"{mode}_over_floor"] = row[f"{mode}_ms"] / row["floor_ms"]
    # The memory floor: the population's parameters and one evaluation call's activations.
    row["population_mb"] = sum(x.numel() * x.element_size()
                               for x in optree.tree_leaves(candidates)) / 2**20
    row["floor_peak_mb"] = row["population_mb"] + peak_mb(lambda: evaluate(candidates), device)
    # The whole swim ray in one call: the same trajectory, fewer calls.
    ray, ray_state = started(variant, population, problem, swim_batch=SWIM + 1)
    stacked = optree.tree_map(lambda x: x.repeat((SWIM + 1,) + (1,) * (x.dim() - 1)), candidates)
    work = cycle(ray.update, ray_state, loss)
    _, row["eager_ray_ms"], row["eager_ray_over_floor"] = paired_ms(
        lambda: [evaluate(candidates) for _ in range(SWIM + 1)], work, repeats, device, CYCLE)
    row["floor_one_call_ms"], _, row["eager_ray_over_one_call_floor"] = paired_ms(
        lambda: evaluate(stacked), work, repeats, device, CYCLE)
    return row


def against(args, problems, variants, repeats) -> None:
    """The baseline's core and ours, eager and compiled, update for update in turn."""
    base, subject = baseline(args.baseline)
    rows = []
    for name, population, problem in problems:
        for variant in variants:
            row = {"problem": name, "variant": variant, "population": population}
            for mode in ("eager", "compiled"):
                runs = []
                for core in (base, fb):
                    opt, state = started(variant, population, problem, core)
                    update = compiled(opt.update, mode)
                    update(state, problem[1])
                    runs.append(cycle(update, state, problem[1]))
                base_ms, ours_ms, ratio = paired_ms(*runs, repeats, args.device)
                row[mode] = {"baseline_ms": base_ms / CYCLE, "ours_ms": ours_ms / CYCLE,
                             "ratio": ratio}
            rows.append(row)
    md = [f"# Update time: this checkout's core against `{subject}` ({args.device})", "",
          "Per chained update, back to back in one process; ratio: median ours / baseline.", ""]
    md += table("problem | variant | P | eager baseline ms | eager ours ms | eager ratio | "
                "compiled baseline ms | compiled ours ms | compiled ratio",
                [[r["problem"], r["variant"], r["population"]] + [
                    f"{r[m][k]:.3f}" for m in ("eager", "compiled")
                    for k in ("baseline_ms", "ours_ms", "ratio")] for r in rows])
    write(args, "update_overhead_baseline", {"baseline": subject, "rows": rows}, md)


def first_compile_here(name: str, quick: bool) -> None:
    """In this fresh process: inductor's CPU probe, then the first compiled call of ``name``."""
    from torch._dynamo.utils import compile_times
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    _, probe = timed(pick_vec_isa)  # what the first compile of each process runs first
    if name == "one-op":
        fn, args = torch.compile(lambda x: x.sin() + 1, fullgraph=True), (torch.ones(8),)
    elif name == "shell":  # torch.optim BFO(compile=True)'s first fast step, adapter_paths' MLP
        model_x_y = mlp((16, 32, 4), 128, "cpu") if quick else mlp((64, 128, 10), 256, "cpu")
        fn, args = stepper(BFO, "fast", *model_x_y, population_size=64, compile=True)[1], ()
    else:
        problem = rastrigin_problem(10 if quick else 30, "cpu")
        opt, state = started(name, 16 if quick else 256, problem)
        fn, args = torch.compile(opt.update, fullgraph=True), (state, problem[1])
    _, took = timed(lambda: fn(*args))
    names, values = compile_times(repr="csv", aggregate=True)  # type: ignore[misc]
    print(json.dumps({"s": probe + took, "probe_s": probe,
                      "trace_s": float(dict(zip(names, values)).get("bytecode_tracing", 0))}))


def first_compile(args) -> None:
    variants, repeats = (["bfo", "shell"], 1) if args.quick else (VARIANTS + ["shell"], 3)
    programs = [("one-op", "cold")] + [(v, when) for v in variants for when in ("cold", "warm")]
    runs: dict = {}
    for _ in range(repeats):
        for isa_ok in ("1",) if args.quick else ("", "1"):
            with tempfile.TemporaryDirectory() as fresh:
                env = {**os.environ, "TMPDIR": fresh, "TORCHINDUCTOR_CACHE_DIR": fresh,
                       "TORCHINDUCTOR_VEC_ISA_OK": isa_ok, "OMP_NUM_THREADS": "2"}
                for name, when in programs:
                    code = f"import update_overhead as u; u.first_compile_here({name!r}, " \
                           f"{args.quick})"
                    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                                         cwd=os.path.dirname(os.path.abspath(__file__)),
                                         capture_output=True, text=True).stdout
                    runs.setdefault((name, isa_ok, when), []).append(
                        json.loads(out.splitlines()[-1]))
    rows = [{"program": name, "vec_isa_ok": bool(isa_ok), "process": when,
             **{k: statistics.median(r[k] for r in found) for k in found[0]}}
            for (name, isa_ok, when), found in runs.items()]
    md = ["# The first compiled update, fresh processes (cpu, D = "
          f"{10 if args.quick else 30}, P = {16 if args.quick else 256})", "",
          f"Medians of {repeats} repeats in new empty inductor folders: `one-op` (inductor's "
          "start-up on a new machine), then each variant's update and `shell` (`BFO(compile=True)`"
          "'s first step, adapter_paths' MLP) cold (unseen) and warm (a second process): the "
          "first call, inductor's CPU probe and Dynamo's tracing in it, seconds.", ""]
    md += table("program | TORCHINDUCTOR_VEC_ISA_OK | process | first call s | probe s | "
                "tracing s", [[r["program"], "1" if r["vec_isa_ok"] else "unset", r["process"],
                               f"{r['s']:.1f}", f"{r['probe_s']:.1f}", f"{r['trace_s']:.1f}"]
                              for r in rows])
    write(args, "first_compile", {"rows": rows}, md)


def main() -> None:
    args = parse(__doc__, ("--baseline", {"type": pathlib.Path, "help": "a checkout to compare"}), (
        "--first-compile", {"action": "store_true", "help": "in fresh processes"}), cold=True)
    if args.first_compile:
        return first_compile(args)
    device = args.device
    variants, repeats = (["bfo"], 3) if args.quick else (VARIANTS, 30)
    modes = ["eager", "compiled"] + (["reduce-overhead"] if device.startswith("cuda") else [])
    problems = ([("rastrigin-10", 16, rastrigin_problem(10, device))] if args.quick else
                [("rastrigin-30", 256, rastrigin_problem(30, device)),
                 ("mlp-64-128-10", 64, mlp_problem((64, 128, 10), 256, device))])
    torch.compile(lambda x: x + 1)(torch.ones(1, device=device))  # inductor's start-up
    if args.baseline is not None:
        return against(args, problems, variants, repeats)
    rows = [time_update(name, v, pop, prob, repeats, device, modes)
            for name, pop, prob in problems for v in variants]
    md = [f"# Update overhead vs the vmapped-evaluation floor ({device})", "",
          "Each ratio divides by the floor run the same way (N_s + 1 evaluation calls), as the "
          "median of per-repeat ratios, floor and update back to back; times per update over "
          f"{CYCLE} chained updates. `eager ray`: `swim_batch=N_s + 1`; `1-call floor`: its "
          "stacked candidates in one call. Peak MB: above what was held, against the "
          "population plus one call (not measured compiled on the CPU).", ""]
    md += table("problem | variant | P | floor ms | " + " | ".join(
        f"{m} ms | {m}/floor" for m in modes) + " | eager ray ms | ray/floor | 1-call floor ms "
        "| ray/1-call floor | compile s | floor peak MB | " + " | ".join(
            f"{m} peak MB" for m in modes), [
        [r["problem"], r["variant"], r["population"], f"{r['floor_ms']:.3f}"]
        + [f"{x:.3f}" if k == 0 else f"{x:.2f}" for m in modes for k, x in enumerate(
            (r[f"{m}_ms"], r.get(f"{m}_over_own_floor", r[f"{m}_over_floor"])))]
        + [f"{r['eager_ray_ms']:.3f}", f"{r['eager_ray_over_floor']:.2f}",
           f"{r['floor_one_call_ms']:.3f}", f"{r['eager_ray_over_one_call_floor']:.2f}",
           f"{r['compiled_compile_s']:.1f}", f"{r['floor_peak_mb']:.3f}"]
        + [f"{r[f'{m}_peak_mb']:.3f}" if f"{m}_peak_mb" in r else "n/a" for m in modes]
        for r in rows])
    write(args, "update_overhead", {"updates": rows}, md)


if __name__ == "__main__":
    main()
