"""Eager updates with the population vmapped in chunks, against one call for all of it.

``fb.bfo`` eager over ``fb.evaluate.vmap(chunk_size=c)`` on MLP classifiers (tanh, cross
entropy) of several widths, sample counts and populations: time per update relative to
``chunk_size=None`` (the default: every candidate in one call), and page faults per update.
Chunks make each call's temporaries (the candidates' activations) smaller; glibc keeps
small freed blocks for reuse but hands large ones back to the system and faults them in
again on the next call. They also make more calls, each with vmap's own overhead. Which
wins depends on a candidate's activations (samples x width), which only the loss knows;
the shell's ``chunk_size=`` group option and ``fb.evaluate.vmap(chunk_size=...)`` are the
same setting. Timings rotate over the chunk sizes of a case, repeat by repeat.

    python benchmarks/chunk_size.py [--quick]
"""

from __future__ import annotations

import resource
import statistics
import time

from common import machine, parser, write
from problems import mlp_problem

import functional_bfo as fb

CHUNKS = (None, 32, 16, 8, 4)
CASES = [  # (widths, samples, population)
    ((64, 128, 10), 256, 64),
    ((64, 128, 10), 1024, 64),
    ((64, 128, 10), 64, 64),
    ((16, 32, 10), 256, 64),
    ((64, 128, 10), 256, 16),
    ((256, 512, 10), 256, 32),
    ((8, 16, 4), 1024, 16),
    ((8, 16, 4), 64, 256),
]


def case(widths, samples, population, repeats: int) -> dict:
    params, loss, _ = mlp_problem(widths, samples, "cpu")
    runs = {}
    for chunk in (c for c in CHUNKS if c is None or c < population):
        opt = fb.bfo(population_size=population, evaluator=fb.evaluate.vmap(chunk_size=chunk))
        runs[chunk] = (opt, opt.update(opt.init(params, key=fb.random.key(0)), loss))
    times: dict = {chunk: [] for chunk in runs}
    faults: dict = {chunk: [] for chunk in runs}
    for _ in range(repeats):
        for chunk, (opt, state) in runs.items():
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            for _ in range(3):
                opt.update(state, loss)
            times[chunk].append((time.perf_counter() - start) / 3 * 1e3)
            faults[chunk].append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                                  - before) / 3)
    whole = statistics.median(times[None])
    return {"widths": list(widths), "samples": samples, "population": population,
            "activations_kib": samples * max(widths[1:-1]) * 4 / 1024, "whole_ms": whole,
            "ratio": {str(c): statistics.median(t) / whole for c, t in times.items()},
            "faults": {str(c): statistics.median(f) for c, f in faults.items()}}


def main() -> None:
    args = parser(__doc__).parse_args()
    cases, repeats = (CASES[:1], 3) if args.quick else (CASES, 7)
    rows = [case(*c, repeats) for c in cases]
    result = {"machine": machine("cpu"), "quick": args.quick, "rows": rows}
    md = [f"# Chunked evaluation, eager fb.bfo ({'quick' if args.quick else 'full'} run)", "",
          f"Machine: {result['machine']}", "",
          "Time per update with `chunk_size=c` over one call of the whole population "
          "(the median of per-repeat times each); page faults per update in brackets. "
          "Activations: one candidate's hidden layer over the samples.", "",
          "| model | samples | P | activations KiB | one call ms | "
          + " | ".join(f"chunk {c}" for c in CHUNKS[1:]) + " |",
          "|---|---|---|---|---|" + "---|" * (len(CHUNKS) - 1)]
    for r in rows:
        cells = [f"{r['ratio'][str(c)]:.2f} ({r['faults'][str(c)]:,.0f})"
                 if str(c) in r["ratio"] else "-" for c in CHUNKS[1:]]
        md.append(f"| {'-'.join(map(str, r['widths']))} | {r['samples']} | "
                  f"{r['population']} | {r['activations_kib']:.0f} | {r['whole_ms']:.1f} "
                  f"({r['faults']['None']:,.0f}) | " + " | ".join(cells) + " |")
    write(args, "chunk_size", result, md)


if __name__ == "__main__":
    main()
