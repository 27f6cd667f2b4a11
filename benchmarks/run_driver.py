"""fb.run in eager against a plain loop of ``opt.update``: the same updates, side by side.

``fb.run`` knows each update's step on the host, so where no reproduction cycle ends it
calls the variant's update built without the masked cycle events (``_cycle.at_step``):
bitwise the same states. This times ``fb.run(opt, state, loss, max_steps=N)`` against
``N`` calls of ``opt.update`` from the same state, one right after the other per repeat;
the ratio is the median of per-repeat ratios (run / loop). Shifted Rastrigin plus 100 in a box,
30 updates from a fresh state: three whole cycles of the adaptive variants
(``chemotaxis_steps=10``), none of ``bfo``'s (100). ``hybrid_bfo`` takes gradients on
every coordinate (``grad_mask=True``).

    python benchmarks/run_driver.py [--quick] [--device cuda]
"""

from __future__ import annotations

import math

import optree
import torch
from common import machine, paired_ms, parser, sync, write

import functional_bfo as fb

OFFSET = 100.0  # a user's loss has no minimum at 0
CASES = [("adaptive_bfo", 8, 10), ("adaptive_bfo", 32, 10), ("adaptive_bfo", 256, 30),
         ("bfo", 32, 10), ("bfo", 256, 30), ("hybrid_bfo", 32, 10), ("hybrid_bfo", 256, 30)]


def rastrigin(dim: int, device: str):
    shift = torch.linspace(-2.0, 2.0, dim, device=device)

    def loss(p):
        z = p["x"] - shift
        return 10 * dim + (z.square() - 10 * torch.cos(2 * math.pi * z)).sum() + OFFSET

    return loss


def case(variant: str, population: int, dim: int, updates: int, repeats: int,
         device: str) -> dict:
    extra = dict(grad_mask=True) if variant == "hybrid_bfo" else {}
    opt = getattr(fb, variant)(population, bounds=(-5.12, 5.12), **extra)
    loss = rastrigin(dim, device)
    state = opt.init({"x": torch.zeros(dim, device=device)}, key=fb.random.key(0))

    def loop():
        s = state
        for _ in range(updates):
            s = opt.update(s, loss)
        sync(device)
        return s

    def driven():
        return fb.run(opt, state, loss, max_steps=updates)

    same = all(torch.equal(a, b) for a, b in zip(optree.tree_leaves(loop()),
                                                 optree.tree_leaves(driven())))
    loop_ms, run_ms, ratio = paired_ms(loop, driven, repeats, device)
    return {"variant": variant, "population": population, "dim": dim, "updates": updates,
            "loop_ms_per_update": loop_ms / updates, "run_ms_per_update": run_ms / updates,
            "run_over_loop": ratio, "bitwise_same": same}


def main() -> None:
    args = parser(__doc__).parse_args()
    updates, repeats = (10, 3) if args.quick else (30, 15)
    rows = [case(*c, updates, repeats, args.device) for c in CASES[: 2 if args.quick else None]]
    md = [f"# fb.run against a loop of opt.update ({'quick' if args.quick else 'full'}, "
          f"{args.device})", "",
          f"Machine: {machine(args.device)}", "",
          f"Shifted Rastrigin plus {OFFSET:g} in [-5.12, 5.12], default settings, {updates} "
          "updates from a fresh state (whole cycles of the adaptive variants' 10), eager; "
          "hybrid_bfo with grad_mask=True; medians of per-repeat "
          "times and ratios.",
          "", "| variant | P | D | loop ms/update | run ms/update | run / loop | bitwise same |",
          "|---|---|---|---|---|---|---|"]
    md += [f"| {r['variant']} | {r['population']} | {r['dim']} | {r['loop_ms_per_update']:.3f} "
           f"| {r['run_ms_per_update']:.3f} | {r['run_over_loop']:.2f} | {r['bitwise_same']} |"
           for r in rows]
    write(args, "run_driver", {"quick": args.quick, "machine": machine(args.device), "rows": rows},
          md)


if __name__ == "__main__":
    main()
