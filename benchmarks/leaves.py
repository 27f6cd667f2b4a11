"""How the cost of one eager update grows with the number of leaves the params are split into.

The same problem, a shifted sphere ``sum((x - 0.3)^2) + 1`` over all D parameters (minimum
1, not 0), is handed to ``bfo``, ``adaptive_bfo`` and ``hybrid_bfo`` (``grad_mask=True``)
as a dict of float32 leaves: D = 40 as 1, 10 or 40 leaves, D = 100 as 1 or 100, at
populations P = 8 and 256 (swim length 4, the default). D stays fixed within a comparison,
so a row against the 1-leaf row of its D is the price of the split alone. Per row:

- ops: the ops one eager ``update`` dispatches (every op overload that reaches a
  ``TorchDispatchMode``: aten ops, and ``functional_bfo``'s random ops, one each), views
  aside (ops whose overload ``is_view``: view, reshape as a view, select, slice, split,
  expand, detach, ...; counted in their own column), and none of the loss's: the ops
  dispatched while ``loss_fn``'s body runs (traced once per vmapped evaluation) and, for
  ``hybrid_bfo``, while autograd runs its backward (the loss's gradient, counted in its own
  column) are the user's, not the optimizer's.
- Python calls: the Python frames entered during the update (``sys.setprofile``'s ``call``
  events, generator resumptions included, C functions not), those inside the loss's body
  aside.
- ms/update: eager, over runs of 20 chained updates (each state fed to the next), the
  median of repeats; the leaf counts of a (variant, P, D) are timed in turn, in a rotating
  order, so that a burst of load on the machine moves them alike. Ratios to the 1-leaf row
  are medians of per-repeat ratios.
- floor: the loss's own share of an update, timed in the same rotation: the N_s + 1
  vmapped evaluations of a population split the same way (``vmap(grad_and_value)`` for
  ``hybrid_bfo``), alone. A loss over 40 leaves is itself 40 times the ops of one, so
  ms/update grows with the leaves whatever the optimizer does; update - floor is the
  optimizer's own time.

It runs on one CPU thread unless ``--threads`` says otherwise (0: torch's default): what a
leaf adds is dispatch and Python, serial work, while torch's intra-op threads can make a
row bimodal on a small machine (on 2 cores, hybrid_bfo at P = 256, D = 100 took 3 ms per
update in one process and 17-24 ms in the next).

Every update counted or timed starts from a state that has already taken 3 updates (the
first can differ), and ``chemotaxis_steps=1000`` keeps reproduction and dispersal out of
reach: the counts are those of the same update step for every leaf count.

With ``--baseline ROOT`` it measures, in one process, this checkout's ``functional_bfo``
and that of another checkout ROOT (say ``git worktree add /tmp/base HEAD``), row by row,
timings interleaved, and reports both with current / baseline ratios (written as
``leaves_baseline``). As in ``update_overhead.py --baseline``, both cores draw with this
checkout's ``random`` module and its CPU kernel (a process can register its random ops
once), so ROOT's ``functional_bfo/random.py`` must be the same file, and ROOT needs no
built kernel of its own: only the update differs.

The op counter sees what reaches the dispatcher's Python mode: the work inside an op
(a C kernel, a library op's own implementation) is one op, a composite op arrives as the
ops it decomposes into, and Python or numpy that calls no op costs time but no op.

    python benchmarks/leaves.py [--quick] [--device cuda] [--variants bfo,...]
                                [--threads N] [--baseline ROOT]

Where the checkouts travel without their history (a lent GPU), ``FB_COMMIT`` and
``FB_BASELINE_COMMIT`` name them.
"""

from __future__ import annotations

import collections
import os
import pathlib
import statistics
import subprocess
import sys
import time

import torch
from common import baseline_core, machine, parser, sync, write
from torch.utils._python_dispatch import TorchDispatchMode

import functional_bfo as fb

VARIANTS = ("bfo", "adaptive_bfo", "hybrid_bfo")
POPULATIONS = (8, 256)
SPLITS = {40: (1, 10, 40), 100: (1, 100)}  # D: the leaf counts it is split into
WARM = 3  # updates taken before the one counted and those timed
SWIM = 4  # the default swim length: N_s + 1 evaluations per update
CHEMOTAXIS_STEPS = 1000  # no reproduction or dispersal within the updates measured
SHIFT = 0.3

_in_loss = 0  # depth of loss_fn bodies running: their ops are the user's


def shifted_sphere(params: dict) -> torch.Tensor:
    """``sum((x - 0.3)^2) + 1`` over every leaf; it marks while its body runs."""
    global _in_loss
    _in_loss += 1
    try:
        return sum((x - SHIFT).square().sum() for x in params.values()) + 1.0
    finally:
        _in_loss -= 1


def split_params(dim: int, leaves: int, device: str) -> dict:
    """D zeros as a dict of ``leaves`` float32 leaves of equal size."""
    if dim % leaves:
        raise ValueError(f"D = {dim} does not split into {leaves} equal leaves")
    return {f"p{i:03d}": torch.zeros(dim // leaves, device=device) for i in range(leaves)}


def warm_start(core, variant: str, population: int, dim: int, leaves: int, device: str):
    """``core``'s update and a state that has taken WARM updates."""
    kwargs = dict(population_size=population, chemotaxis_steps=CHEMOTAXIS_STEPS)
    if variant == "hybrid_bfo":
        kwargs["grad_mask"] = True
    opt = getattr(core, variant)(**kwargs)
    state = opt.init(split_params(dim, leaves, device), key=core.random.key(0))
    for _ in range(WARM):
        state = opt.update(state, shifted_sphere)
    return opt.update, state


def floor_run(variant: str, population: int, dim: int, leaves: int, device: str):
    """The loss's share of one update, called as an update is: N_s + 1 vmapped evaluations."""
    params = split_params(dim, leaves, device)
    generator = torch.Generator(device).manual_seed(0)
    candidates = {k: torch.randn(population, *x.shape, generator=generator, device=device)
                  for k, x in params.items()}
    evaluate = torch.func.vmap(torch.func.grad_and_value(shifted_sphere)
                               if variant == "hybrid_bfo" else shifted_sphere)

    def floor(state, loss_fn):
        for _ in range(SWIM + 1):
            evaluate(candidates)
        return state

    return floor, None


class OpCounter(TorchDispatchMode):
    """Counts every op overload dispatched, by kind: the loss's, its backward's, views, ops."""

    def __init__(self):
        super().__init__()
        self.counts = {kind: collections.Counter()
                       for kind in ("ops", "view_ops", "loss_backward_ops", "loss_ops")}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _in_loss:
            kind = "loss_ops"
        elif torch._C._current_autograd_node() is not None:  # autograd's backward
            kind = "loss_backward_ops"
        elif func.is_view:
            kind = "view_ops"
        else:
            kind = "ops"
        self.counts[kind][str(func)] += 1
        return func(*args, **(kwargs or {}))


def python_calls(update, state) -> int:
    """Python frames entered during one update, those inside the loss's body aside."""
    calls = 0

    def profile(frame, event, arg):
        nonlocal calls
        if event == "call" and not _in_loss:
            calls += 1

    sys.setprofile(profile)
    try:
        update(state, shifted_sphere)
    finally:
        sys.setprofile(None)
    return calls


def count(update, state) -> dict:
    """Op and call counts of the update from ``state``, taken twice to check they repeat."""
    takes = []
    for _ in range(2):
        with OpCounter() as counter:
            update(state, shifted_sphere)
        take = {kind: sum(c.values()) for kind, c in counter.counts.items()}
        take["python_calls"] = python_calls(update, state)
        takes.append(take)
    out = dict(takes[0], repeatable=takes[0] == takes[1])
    out["op_counts"] = dict(counter.counts["ops"].most_common())
    out["view_op_counts"] = dict(counter.counts["view_ops"].most_common())
    return out


def chained_ms(update, state, chain: int, device: str) -> float:
    """ms per update over ``chain`` updates, each state fed to the next."""
    sync(device)
    start = time.perf_counter()
    for _ in range(chain):
        state = update(state, shifted_sphere)
    sync(device)
    return 1e3 * (time.perf_counter() - start) / chain


def measure(cores: dict, variant: str, population: int, dim: int, chain: int, repeats: int,
            device: str) -> list[dict]:
    """Counts and times of every (core, leaf count) of one (variant, P, D), timed in turn."""
    runs = {(name, leaves): warm_start(core, variant, population, dim, leaves, device)
            for name, core in cores.items() for leaves in SPLITS[dim]}
    counts = {entry: count(*run) for entry, run in runs.items()}
    runs.update({("floor", leaves): floor_run(variant, population, dim, leaves, device)
                 for leaves in SPLITS[dim]})
    for run in runs.values():  # warm-up
        chained_ms(*run, chain, device)
    order = list(runs)
    times = collections.defaultdict(list)
    for r in range(repeats):
        for entry in order[r % len(order):] + order[:r % len(order)]:
            times[entry].append(chained_ms(*runs[entry], chain, device))

    def median_ratio(a, b) -> float:
        return statistics.median(x / y for x, y in zip(times[a], times[b]))

    def own_ms(name: str, leaves: int) -> list[float]:
        return [u - f for u, f in zip(times[name, leaves], times["floor", leaves])]

    rows = []
    for leaves in SPLITS[dim]:
        row = {"variant": variant, "population": population, "dim": dim, "leaves": leaves,
               "floor_ms": statistics.median(times["floor", leaves])}
        for name in cores:
            one = counts[name, 1]
            own = statistics.median(own_ms(name, leaves))
            row[name] = {**counts[name, leaves], "ms": statistics.median(times[name, leaves]),
                         "over_floor_ms": own,
                         "over_floor_over_1_leaf": own / statistics.median(own_ms(name, 1)),
                         "ops_over_1_leaf": counts[name, leaves]["ops"] / one["ops"],
                         "python_calls_over_1_leaf":
                             counts[name, leaves]["python_calls"] / one["python_calls"],
                         "ms_over_1_leaf": median_ratio((name, leaves), (name, 1))}
        if "baseline" in cores:
            base, cur = row["baseline"], row["current"]
            row["current_over_baseline"] = {
                **{k: cur[k] / base[k] if base[k] else None
                   for k in ("ops", "view_ops", "loss_backward_ops", "python_calls")},
                "ms": median_ratio(("current", leaves), ("baseline", leaves))}
        rows.append(row)
    return rows


def plain_markdown(result: dict) -> list[str]:
    md = ["| variant | P | D | leaves | ops | view ops | loss-backward ops | Python calls | "
          "ms/update | floor ms | update - floor ms | ops / 1 leaf | calls / 1 leaf | "
          "ms / 1 leaf | update - floor / 1 leaf |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        c = r["current"]
        md.append(f"| {r['variant']} | {r['population']} | {r['dim']} | {r['leaves']} | "
                  f"{c['ops']} | {c['view_ops']} | {c['loss_backward_ops']} | "
                  f"{c['python_calls']} | {c['ms']:.2f} | {r['floor_ms']:.2f} | "
                  f"{c['over_floor_ms']:.2f} | {c['ops_over_1_leaf']:.2f} | "
                  f"{c['python_calls_over_1_leaf']:.2f} | {c['ms_over_1_leaf']:.2f} | "
                  f"{c['over_floor_over_1_leaf']:.2f} |")
    return md


def baseline_markdown(result: dict) -> list[str]:
    def ratio(x) -> str:
        return "n/a" if x is None else f"{x:.2f}"

    md = ["Counts: baseline / current, and current / baseline.", "",
          "| variant | P | D | leaves | ops | ops ratio | ops / 1 leaf | view ops | "
          "loss-backward ops | Python calls | calls ratio |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        b, c, q = r["baseline"], r["current"], r["current_over_baseline"]
        md.append(f"| {r['variant']} | {r['population']} | {r['dim']} | {r['leaves']} | "
                  f"{b['ops']} / {c['ops']} | {ratio(q['ops'])} | "
                  f"{b['ops_over_1_leaf']:.2f} / {c['ops_over_1_leaf']:.2f} | "
                  f"{b['view_ops']} / {c['view_ops']} | "
                  f"{b['loss_backward_ops']} / {c['loss_backward_ops']} | "
                  f"{b['python_calls']} / {c['python_calls']} | {ratio(q['python_calls'])} |")
    md += ["", "Time per eager update (ms): baseline / current, current / baseline, and each "
           "against its own 1-leaf row; the floor (the loss's own evaluations, alone) and "
           "update - floor, the optimizer's own time.", "",
           "| variant | P | D | leaves | ms/update | ms ratio | ms / 1 leaf | floor ms | "
           "update - floor ms | update - floor / 1 leaf |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        b, c, q = r["baseline"], r["current"], r["current_over_baseline"]
        md.append(f"| {r['variant']} | {r['population']} | {r['dim']} | {r['leaves']} | "
                  f"{b['ms']:.2f} / {c['ms']:.2f} | {q['ms']:.2f} | "
                  f"{b['ms_over_1_leaf']:.2f} / {c['ms_over_1_leaf']:.2f} | "
                  f"{r['floor_ms']:.2f} | {b['over_floor_ms']:.2f} / {c['over_floor_ms']:.2f} | "
                  f"{b['over_floor_over_1_leaf']:.2f} / {c['over_floor_over_1_leaf']:.2f} |")
    return md


def provenance(core, variable: str) -> str:
    """Where ``core`` was imported from: its checkout's commit, and whether its package has
    uncommitted changes there; the environment's ``variable`` where the tree travels without
    its history (a lent GPU)."""
    if given := os.environ.get(variable):
        return given
    folder = pathlib.Path(core.__file__).parent

    def git(*cmd: str) -> str:
        return subprocess.run(["git", "-C", str(folder.parent), *cmd], capture_output=True,
                              text=True).stdout.strip()

    commit = git("log", "-1", "--format=%h %s")[:72]
    if not commit:
        return str(folder)
    changed = git("status", "--porcelain", "--", str(folder))
    return f"{commit}" + (" + uncommitted changes in functional_bfo/" if changed else "")


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--baseline", type=pathlib.Path, help="a checkout whose core to compare")
    p.add_argument("--threads", type=int, default=1,
                   help="torch's intra-op CPU threads (default 1; 0: torch's default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    variants = ["bfo"] if args.quick else args.variants.split(",")
    populations = (8,) if args.quick else POPULATIONS
    dims = (40,) if args.quick else tuple(SPLITS)
    chain, repeats = (5, 3) if args.quick else (20, 7)
    cores = {"current": fb}
    if args.baseline is not None:
        cores = {"baseline": baseline_core(args.baseline.resolve()), "current": fb}
    variables = {"current": "FB_COMMIT", "baseline": "FB_BASELINE_COMMIT"}
    sources = {name: provenance(core, variables[name]) for name, core in cores.items()}
    commit = sources.get("baseline")
    load, start = os.getloadavg()[0], time.perf_counter()
    rows = [row for v in variants for pop in populations for dim in dims
            for row in measure(cores, v, pop, dim, chain, repeats, args.device)]
    result = {"machine": machine(args.device), "quick": args.quick,
              "cpu_kernel": fb.random.CPU_KERNEL, "current": sources["current"],
              "baseline": commit,
              "warm_updates": WARM, "counted_step": WARM, "chemotaxis_steps": CHEMOTAXIS_STEPS,
              "swim_length": 4, "chained_updates": chain, "repeats": repeats,
              "seconds": time.perf_counter() - start,
              "load_average_1min": [load, os.getloadavg()[0]], "rows": rows}
    title = ("# Eager update cost by number of leaves"
             + (": this checkout against a baseline" if commit else "")
             + f" ({'quick' if args.quick else 'full'} run, {args.device})")
    md = [title, "", f"Machine: {result['machine']}", "",
          f"Current: `{sources['current']}`", ""]
    if commit:
        md += [f"Baseline: `{commit}`", ""]
    md += ["One eager update of a shifted sphere (D parameters as that many float32 leaves), "
           f"from a state {WARM} updates in (step {WARM}), swim length 4, no reproduction "
           "within reach. ops: the op overloads dispatched outside the loss's body and its "
           "backward, views aside (their own column); loss-backward ops: those of hybrid_bfo's "
           "gradient of the loss; Python calls: frames entered outside the loss's body. "
           f"ms/update: median of {repeats} runs of {chain} chained updates, leaf counts "
           "timed in turn; ratios to the 1-leaf row of the same D are medians of per-repeat "
           "ratios.", ""]
    if not all(r[name]["repeatable"] for r in rows for name in cores):
        md += ["Some counts differed between two takes of the same update (see the JSON).", ""]
    md += baseline_markdown(result) if commit else plain_markdown(result)
    md += ["", f"Measured in {result['seconds']:.0f} s; the machine's 1-minute load average "
           f"{load:.2f} at the start, {result['load_average_1min'][1]:.2f} at the end."]
    write(args, "leaves_baseline" if commit else "leaves", result, md)


if __name__ == "__main__":
    main()
