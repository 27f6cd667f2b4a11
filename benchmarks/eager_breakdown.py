"""Where an eager update's time goes: each part timed alone, beside the whole update.

``fb.bfo``, ``fb.adaptive_bfo`` and ``fb.hybrid_bfo`` (``grad_mask=True``) at their
defaults in a box, on a shifted 30-D Rastrigin at P = 256 (swim length 4: five evaluator
calls an update), eager, one thread. Each part runs on the inputs an update gives it and is
timed right after the update itself, repeat by repeat; its share is the median of the
per-repeat ratios part / update:

- the five vmapped evaluations: ``torch.func.vmap`` of the loss of one candidate, over five
  populations, as the default evaluator calls it (the floor of ``update_overhead.py``;
  ``grad_and_value`` under it for the hybrid);
- the five batched evaluations: the same loss written for a batch, called on the five
  populations without ``vmap`` (what EvoX's ``Problem.evaluate`` is; for the hybrid, with
  one backward of the summed losses): the difference is ``vmap``'s own cost;
- the noise: one update's normals (P rows of 2D + 3, ``bacterium_noise``);
- the swim ray's projection into the box: the five points of every bacterium reflected and
  clamped at once (``_bounds.project``);
- the masked cycle events (reproduction and dispersal): the update less the update built
  without them (the twin ``_cycle.at_step`` picks where no cycle ends, the same states).

``--quick`` runs ``fb.bfo`` at P = 32, D = 10.

    python benchmarks/eager_breakdown.py [--quick] [--device cuda]
"""

from __future__ import annotations

import math

import torch
from common import machine, paired_ms, parser, write

import functional_bfo as fb
from functional_bfo._bounds import check_bounds, project, update_box
from functional_bfo._population import bacterium_noise

SWIM = 4
BOUNDS = (-5.12, 5.12)
CALLS = 10  # calls of a part per timing: a part of tens of microseconds, timed in bulk


def grad_and_value_batched(loss):
    """Each candidate's loss and gradient from one backward of their sum (they are independent)."""
    def evaluate(params):
        x = params["x"].detach().requires_grad_()
        losses = loss({"x": x})
        return torch.autograd.grad(losses.sum(), x)[0], losses.detach()
    return evaluate


def breakdown(variant: str, population: int, dim: int, repeats: int, device: str) -> dict:
    """The parts of one eager update of ``variant`` (see the module's docstring)."""
    shift = torch.linspace(-2.0, 2.0, dim, device=device)

    def loss(params):  # of one candidate, or of a batch (a leading axis)
        z = params["x"] - shift
        return 10 * dim + (z.square() - 10 * torch.cos(2 * math.pi * z)).sum(-1)

    extra = dict(grad_mask=True) if variant == "hybrid_bfo" else {}
    opt = getattr(fb, variant)(population, bounds=BOUNDS, **extra)
    state = opt.init({"x": torch.zeros(dim, device=device)}, key=fb.random.key(0))
    for _ in range(3):  # the update of step 3, which ends no cycle of either cycle length
        state = opt.update(state, loss)
    without_events = opt.twin.update
    populations = [{"x": state.population + 0.01 * k} for k in range(SWIM + 1)]
    hybrid = variant == "hybrid_bfo"
    vmapped = torch.func.vmap(torch.func.grad_and_value(loss) if hybrid else loss)
    batched = grad_and_value_batched(loss) if hybrid else loss
    direction = torch.nn.functional.normalize(torch.randn_like(state.population), dim=1)
    ray = state.population + 0.1 * torch.arange(1, SWIM + 2, device=device).reshape(
        -1, 1, 1) * direction
    box = update_box(state.box, check_bounds(BOUNDS), True)
    parts = {
        "update without the cycle events": lambda: without_events(state, loss),
        "5 vmapped evaluations": lambda: [vmapped(p) for p in populations],
        "5 batched evaluations": lambda: [batched(p) for p in populations],
        "noise": lambda: bacterium_noise(state.key, state.step, population, dim, torch.float32),
        "swim ray projection": lambda: project(ray, box, "reflect"),
    }
    update_ms, rows = None, []
    for name, part in parts.items():
        whole, ms, share = paired_ms(lambda: [opt.update(state, loss) for _ in range(CALLS)],
                                     lambda part=part: [part() for _ in range(CALLS)],
                                     repeats, device)
        update_ms = whole / CALLS if update_ms is None else update_ms
        rows.append({"part": name, "ms": ms / CALLS, "share": share})
    by_name = {r["part"]: r for r in rows}
    rows.append({"part": "cycle events (the update less the one without them)",
                 "ms": update_ms * (1 - by_name["update without the cycle events"]["share"]),
                 "share": 1 - by_name["update without the cycle events"]["share"]})
    rows.append({"part": "vmap's own (vmapped less batched evaluations)",
                 "ms": by_name["5 vmapped evaluations"]["ms"]
                 - by_name["5 batched evaluations"]["ms"],
                 "share": by_name["5 vmapped evaluations"]["share"]
                 - by_name["5 batched evaluations"]["share"]})
    return {"variant": variant, "update_ms": update_ms, "rows": rows}


def main() -> None:
    args = parser(__doc__).parse_args()
    torch.set_num_threads(1)
    population, dim, repeats = (32, 10, 5) if args.quick else (256, 30, 31)
    variants = ["bfo"] if args.quick else ["bfo", "adaptive_bfo", "hybrid_bfo"]
    runs = [breakdown(v, population, dim, repeats, args.device) for v in variants]
    result = {"machine": machine(args.device), "quick": args.quick, "population": population,
              "dim": dim, "variants": runs}
    md = [f"# Where an eager update's time goes ({'quick' if args.quick else 'full'}, "
          f"{args.device})", "", f"Machine: {result['machine']}", "",
          f"Shifted Rastrigin, D = {dim}, P = {population}, defaults in a box, eager, one "
          "thread. Each part timed alone, paired with the update; share: the median of "
          "per-repeat ratios part / update.", ""]
    for run in runs:
        md += [f"`fb.{run['variant']}`: {run['update_ms']:.3f} ms an update.", "",
               "| part | ms | share of the update |", "|---|---|---|"]
        md += [f"| {r['part']} | {r['ms']:.3f} | {r['share']:.2f} |" for r in run["rows"]]
        md.append("")
    write(args, "eager_breakdown", result, md)


if __name__ == "__main__":
    main()
