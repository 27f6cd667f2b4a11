"""Speed vs peers, side by side in one run: evaluations per second and time to a target.

One shifted Rastrigin (30-D, population 256): ``fb.bfo`` eager (also with ``swim_batch=5``,
and given the batched loss EvoX is given) and compiled, ``fb.adaptive_bfo`` compiled, the
``torch.optim`` adapter's closure and fast paths, every installed peer of ``peers.py`` (on a
numpy version of the function, so that the peer's own speed is measured) and EvoX's PSO
(``pip install evox``), eager and compiled; ratios to the fastest BFO peer of the run. With
EvoX, eager ``fb.bfo`` (a loop of ``update``, ``fb.run``, the batched loss) and EvoX's eager
PSO are also timed in turn, the median of their ratios over repeats.

    python benchmarks/speed.py [--quick] [--device cuda]
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import math
import statistics
import time

import numpy as np
import peers
import torch
from common import parse, sync, table, timed, write
from problems import BOXES, rastrigin, shift_of

import functional_bfo as fb
from functional_bfo.adapters import BFO

BOX = (-BOXES["rastrigin"], BOXES["rastrigin"])


def rastrigin_pair(dim: int, seed: int, device: str):
    """The same shifted Rastrigin as a torch loss on {"x": ...} (of one candidate, or of a batch:
    a leading axis) and as a numpy function."""
    shift = shift_of("rastrigin", dim, torch.Generator().manual_seed(seed))
    shift_np, shift_t = shift.numpy(), shift.to(device=device, dtype=torch.float32)
    return (lambda params: rastrigin(params["x"] - shift_t),
            lambda x: float(rastrigin(x - shift_np, np)))


def whole_population(loss_fn, population, *args):
    """An evaluator for a loss written for a batch, as EvoX's ``Problem`` takes it: one call
    on every candidate (a leading axis on each leaf), no ``vmap``."""
    return loss_fn(population, *args)


def row(name: str, kind: str, history: list, compile_s: float = 0.0) -> dict:
    """A table row from a run's history of (evals, best, seconds), its last entry the end."""
    evals, best, seconds = history[-1]
    return {"name": name, "kind": kind, "evals": evals, "seconds": seconds, "best": best,
            "compile_s": compile_s, "history": history}


def steady(step, steps: int, per_step: int, device: str) -> list[tuple[int, float, float]]:
    """``steps`` calls of ``step`` (each returns the best as a tensor) as a user's loop makes
    them, one host sync at the end; each call, of the same evaluations, takes total / steps."""
    gc.collect()  # the compilers' garbage: a full collection must not land in a timing
    sync(device)
    start = time.perf_counter()
    bests = [step() for _ in range(steps)]
    sync(device)
    seconds = time.perf_counter() - start
    return [(k * per_step, b, k * seconds / steps)
            for k, b in enumerate(torch.stack(bests).tolist(), start=1)]


def run_ours(name: str, factory, loss, dim, population, budget, device, compiled=False) -> dict:
    """Our update in a plain loop, eager or compiled."""
    opt = factory(population_size=population, bounds=BOX)
    state = opt.init({"x": torch.zeros(dim, device=device)}, key=fb.random.key(0))
    update = torch.compile(opt.update, fullgraph=True) if compiled else opt.update
    init_evals = int(state.num_evals)
    # Two warm-up updates, timed apart: the first compiles, the second gets a state it wrote.
    state, compile_s = timed(lambda: update(update(state, loss), loss), device)
    evals0 = int(state.num_evals)
    per_update = (evals0 - init_evals) // 2
    # At least 100 updates: a compiled update on a GPU takes well under a millisecond, and a
    # budget spent in a few dozen would time the start-up, not the steady state.
    updates = max(100, math.ceil(budget / per_update))
    current = [state]

    def step():
        current[0] = update(current[0], loss)
        return current[0].best_loss

    history = steady(step, updates, per_update, device)
    if int(current[0].num_evals) - evals0 != updates * per_update:
        raise RuntimeError(f"{name}: updates did not all cost {per_update} evaluations")
    return row(name, "ours", history, compile_s if compiled else 0.0)


def run_adapter(name: str, loss, dim, population, budget, device, fast: bool) -> dict:
    gc.collect()  # the compilers' garbage: a full collection must not land in a timing
    x = torch.nn.Parameter(torch.zeros(dim, device=device))
    opt = BFO([x], population_size=population, seed=0, reevaluate=False, bounds=BOX)

    history, start = [], time.perf_counter()
    while opt.num_evals < budget:
        best = (opt.step(loss_fn=lambda p: loss({"x": p[0]})) if fast
                else opt.step(lambda: loss({"x": x}).item()))
        history.append((opt.num_evals, best, time.perf_counter() - start))
    return row(name, "ours", history)


def run_evox(name: str, dim: int, population: int, budget: int, device: str,
             compiled: bool) -> dict:
    """EvoX's PSO on the same function (batched in torch), its step compiled as EvoX
    documents it or eager."""
    shift = shift_of("rastrigin", dim, torch.Generator().manual_seed(0)).to(device)
    algorithm, workflow = peers.evox_pso(population, dim, shift, device)
    step = torch.compile(workflow.step) if compiled else workflow.step
    # Timed apart: the first step compiles, the second again (a state its first step wrote).
    _, compile_s = timed(lambda: (step(), step()), device)

    def stepped():  # one step, and the best so far
        step()
        return algorithm.global_best_fit.clone()

    history = steady(stepped, max(100, math.ceil(budget / population)), population, device)
    return row(name, "peer", history, compile_s if compiled else 0.0)


def run_driver(loss, dim: int, population: int, budget: int, device: str) -> dict:
    """Eager ``fb.bfo`` driven by ``fb.run``, which leaves out the cycle events of the
    updates that end no cycle (it reads the step anyway): evaluations and seconds."""
    opt = fb.bfo(population_size=population, bounds=BOX)
    state = opt.init({"x": torch.zeros(dim, device=device)}, key=fb.random.key(0))
    state = fb.run(opt, state, loss, max_steps=2)  # the warm-up run_ours takes
    evals0 = int(state.num_evals)
    updates = max(100, math.ceil(budget / (evals0 // 2)))
    gc.collect()
    state, seconds = timed(lambda: fb.run(opt, state, loss, max_steps=updates), device)
    return {"evals": int(state.num_evals) - evals0, "seconds": seconds}


def eager_against_evox(loss, dim: int, population: int, budget: int, device: str,
                       repeats: int) -> dict:
    """Eager ``fb.bfo`` (a loss of one candidate, vmapped, in a loop of ``update`` and
    under ``fb.run``; the batched loss EvoX is given) and EvoX's eager PSO in turn,
    ``repeats`` times: one run of each reads 10% apart from the next on a shared machine,
    the median of the ratios less."""
    rates: dict[str, list[float]] = {"ours": [], "ours_run": [], "ours_batched": [], "evox": []}
    batched = functools.partial(fb.bfo, evaluator=whole_population)
    for _ in range(repeats):
        for name, row in (
                ("ours", run_ours("fb.bfo eager", fb.bfo, loss, dim, population, budget, device)),
                ("ours_run", run_driver(loss, dim, population, budget, device)),
                ("ours_batched", run_ours("fb.bfo eager, batched loss", batched, loss, dim,
                                          population, budget, device)),
                ("evox", run_evox("evox PSO eager", dim, population, budget, device, False))):
            rates[name].append(row["evals"] / row["seconds"])
    ratios = {"ratio" + name.removeprefix("ours"): statistics.median(
                  a / b for a, b in zip(rates[name], rates["evox"]))
              for name in ("ours", "ours_run", "ours_batched")}
    return {"repeats": repeats, **{k: statistics.median(v) for k, v in rates.items()}, **ratios}


def run_peer(name: str, numpy_loss, dim, population, budget) -> dict:
    gc.collect()  # the compilers' garbage: a full collection must not land in a timing
    out = peers.run_peer(name, numpy_loss, dim, *BOX, budget, population, seed=0)
    rate = out["seconds"] / max(out["evals"], 1)  # peers report no clock per evaluation
    history = [(e, b, e * rate) for e, b in out["history"]]
    return row(name, "cma" if name.startswith("cma") else "bfo peer",
               history + [(out["evals"], out["best"], out["seconds"])])


def main() -> None:
    args = parse(__doc__, cold=True)
    dim, population, budget = (10, 32, 2_000) if args.quick else (30, 256, 40_000)
    device = args.device
    loss, numpy_loss = rastrigin_pair(dim, 0, device)
    start_loss = numpy_loss(np.zeros(dim))
    target = 0.6 * start_loss  # the time-to-target threshold
    ours = functools.partial(run_ours, loss=loss, dim=dim, population=population,
                             budget=budget, device=device)
    rows = [
        ours("fb.bfo eager", fb.bfo),
        ours("fb.bfo eager, swim_batch=5", functools.partial(fb.bfo, swim_batch=5)),  # one call
        ours("fb.bfo eager, batched loss", functools.partial(fb.bfo, evaluator=whole_population)),
        ours("fb.bfo compiled", fb.bfo, compiled=True),
        ours("fb.adaptive_bfo compiled", fb.adaptive_bfo, compiled=True),
        run_adapter("adapters.BFO fast path", loss, dim, population, budget, device, True),
        run_adapter("adapters.BFO closure", loss, dim, population,
                    budget // (10 if not args.quick else 1), device, False)]
    rows += [run_peer(name, numpy_loss, dim, population, budget) for name in peers.available()]
    if importlib.util.find_spec("evox") is not None:  # a torch peer: eager and compiled
        rows += [run_evox(f"evox PSO {mode}", dim, population, budget, device, mode == "compiled")
                 for mode in ("eager", "compiled")]
    for r in rows:
        r["evals_per_s"] = r["evals"] / r["seconds"]
        r["seconds_to_target"] = next((s for _, b, s in r["history"] if b <= target), None)
    bfo_peers = [r for r in rows if r["kind"] == "bfo peer"]
    fastest = max(bfo_peers, key=lambda r: r["evals_per_s"]) if bfo_peers else None
    for r in rows:
        r["x_fastest_bfo_peer"] = r["evals_per_s"] / fastest["evals_per_s"] if fastest else None
    result = {"dim": dim, "population": population, "budget": budget, "target": target,
              "fastest_bfo_peer": fastest["name"] if fastest else None,
              "rows": [{k: v for k, v in r.items() if k != "history"} for r in rows],
              # Every improvement of every run would be 100s of KB: 100 points each.
              "histories": {r["name"]: r["history"][:-1:max(1, len(r["history"]) // 100)]
                            + r["history"][-1:] for r in rows}}
    md = [f"# Speed vs peers ({device})", "", f"Shifted Rastrigin, D={dim}, population "
          f"{population}, {budget} evaluations each (the adapter's closure path "
          f"{budget // (1 if args.quick else 10)}; our updates at least 100); target "
          f"{target:.1f} (start {start_loss:.1f}). Peers run on the CPU with a numpy "
          "objective.", ""]
    md += table("optimizer | evaluations/s | x fastest BFO peer | best | s to target | "
                "compile s", [
                    [r["name"], f"{r['evals_per_s']:,.0f}", "" if r["x_fastest_bfo_peer"] is None
                     else f"{r['x_fastest_bfo_peer']:.1f}x", f"{r['best']:.1f}",
                     "not reached" if r["seconds_to_target"] is None
                     else f"{r['seconds_to_target']:.2f}", f"{r['compile_s']:.1f}"]
                    for r in rows])
    if not bfo_peers:
        md += ["", "No BFO peer is installed (pip install -e \".[bench]\"): no ratios."]
    if importlib.util.find_spec("evox") is not None:
        pair = result["eager_against_evox"] = eager_against_evox(
            loss, dim, population, budget, device, 1 if args.quick else 7)
        md += ["", f"Eager `fb.bfo` (its defaults) in a loop of `update` and under `fb.run`, "
               "eager `fb.bfo` given the batched loss EvoX is given, and EvoX's eager PSO "
               f"in turn, {pair['repeats']} times: medians {pair['ours']:,.0f}, "
               f"{pair['ours_run']:,.0f}, {pair['ours_batched']:,.0f} and "
               f"{pair['evox']:,.0f} evaluations/s; median ratios to EvoX "
               f"{pair['ratio']:.2f}x, {pair['ratio_run']:.2f}x and "
               f"{pair['ratio_batched']:.2f}x."]
    write(args, "speed", result, md)


if __name__ == "__main__":
    main()
