"""Time an update with one swim point per evaluation call against the whole ray in one call.

``swim_batch`` changes only how the N_s + 1 swim points are grouped into evaluator calls
(the trajectory is bitwise the same), so this measures per-call overhead against the cost
of larger batches: ``fb.bfo`` eager on 30- to 3000-D Rastrigin (P = 256) and on MLPs of
three widths on 256 samples (P = 64), and compiled on the two problems of
``update_overhead.py``. The ratio is the whole ray's time over one point per call (the
median of per-repeat ratios).

    python benchmarks/swim_batch.py [--quick] [--device cuda]
"""

from __future__ import annotations

import torch
from common import compile_cold, machine, paired_ms, parser, write
from problems import mlp_problem, rastrigin_problem

import functional_bfo as fb

SWIM = 4


def time_batches(name: str, population: int, problem, mode: str, repeats: int,
                 device: str) -> dict:
    params, loss, extra = problem
    row = {"problem": name, "population": population, "mode": mode,
           "point_kib": population * sum(x.numel() * x.element_size()
                                         for x in params.values()) / 1024}
    calls = []
    for batch in (1, SWIM + 1):
        opt = fb.bfo(population_size=population, swim_length=SWIM, chemotaxis_steps=10,
                     swim_batch=batch, **extra)
        state = opt.update(opt.init(params, key=fb.random.key(0)), loss)
        update = opt.update
        if mode == "compiled":
            torch.compiler.reset()
            update = torch.compile(opt.update, fullgraph=True)
            update(state, loss)
        calls.append(lambda u=update, s=state: u(s, loss))
    # Back to back per repeat, so load on a shared machine moves both and not the ratio.
    row["batch_1_ms"], row[f"batch_{SWIM + 1}_ms"], row["ratio"] = paired_ms(
        *calls, repeats, device)
    return row


def main() -> None:
    compile_cold()
    args = parser(__doc__).parse_args()
    device = args.device
    if args.quick:
        cases = [("rastrigin-10", 32, rastrigin_problem(10, device), "eager")]
    else:
        cases = ([(f"rastrigin-{d}", 256, rastrigin_problem(d, device), "eager")
                  for d in (30, 300, 1000, 3000)]
                 + [(f"mlp-{'-'.join(map(str, w))}", 64, mlp_problem(w, 256, device), "eager")
                    for w in ((16, 32, 10), (32, 64, 10), (64, 128, 10))]
                 + [("rastrigin-30", 256, rastrigin_problem(30, device), "compiled"),
                    ("mlp-64-128-10", 64, mlp_problem((64, 128, 10), 256, device),
                     "compiled")])
    repeats = 5 if args.quick else 30
    rows = [time_batches(name, pop, prob, mode, repeats, device)
            for name, pop, prob, mode in cases]
    result = {"machine": machine(device), "quick": args.quick, "swim_length": SWIM,
              "rows": rows}
    md = [f"# Swim points per evaluation call ({'quick' if args.quick else 'full'} run, "
          f"{device})", "", f"Machine: {result['machine']}", "",
          f"`fb.bfo`, swim_length = {SWIM}: `swim_batch=1` makes {SWIM + 1} evaluator calls "
          f"of P candidates per update, `swim_batch={SWIM + 1}` one call of {SWIM + 1} P; the "
          "trajectory is the same. A point's candidates: P times the parameters' bytes.", "",
          "| problem | P | mode | a point's candidates KiB | one point per call ms "
          "| whole ray per call ms | ratio |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['problem']} | {r['population']} | {r['mode']} | "
                  f"{r['point_kib']:,.0f} | {r['batch_1_ms']:.2f} | "
                  f"{r[f'batch_{SWIM + 1}_ms']:.2f} | {r['ratio']:.2f} |")
    write(args, "swim_batch", result, md)


if __name__ == "__main__":
    main()
