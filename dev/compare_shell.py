"""The torch.optim shell's time per step at several commits, interleaved in one process.

Each commit's ``functional_bfo`` and adapters are extracted as by ``compare_commits.py``; every
copy's ``BFO``, ``AdaptiveBFO`` and ``HybridBFO`` step a tiny model (a 4-8-1 MLP on 16
samples), so a step's time is the shell's and the core's, not the model's. Rounds alternate
between the copies; the table gives each commit's median ms per step and the median of its
per-round ratios to the first commit, on the closure path and the fast path.

    python dev/compare_shell.py 47bd054 HEAD [--quick]
"""

from __future__ import annotations

import importlib
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from common import machine, parser, write  # noqa: E402
from compare_commits import extract  # noqa: E402


def tiny():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    return model, torch.randn(16, 4), torch.randn(16, 1)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("revs", nargs="+", help="commits to compare; the first is the baseline")
    p.set_defaults(out=REPO / "dev" / "results")
    args = p.parse_args()
    rounds, per_round = (3, 3) if args.quick else (15, 10)
    folder = Path(tempfile.mkdtemp(prefix="fb-shell-"))
    sys.path.insert(0, str(folder))
    packages = []
    for i, rev in enumerate(args.revs):
        commit = extract(rev, f"fb_shell_{i}", folder)
        packages.append((rev, importlib.import_module(f"fb_shell_{i}.adapters"), commit))
    rows = []
    for cls_name in ("BFO", "AdaptiveBFO", "HybridBFO"):
        for path in ("closure", "fast"):
            runs = []
            for rev, adapters, commit in packages:
                model, x, y = tiny()
                opt = getattr(adapters, cls_name)(model.named_parameters(),
                                                  population_size=16, seed=0)

                def closure(opt=opt, model=model, x=x, y=y):
                    opt.zero_grad()
                    loss = (model(x) - y).square().mean()
                    loss.backward()
                    return loss

                def loss_fn(params, model=model, x=x, y=y):
                    return (torch.func.functional_call(model, params, (x,)) - y).square().mean()

                step = ((lambda opt=opt, c=closure: opt.step(c)) if path == "closure"
                        else (lambda opt=opt, f=loss_fn: opt.step(loss_fn=f)))
                for _ in range(3):
                    step()
                runs.append({"rev": rev, "commit": commit, "step": step, "opt": opt, "ms": []})
            for _ in range(rounds):
                for run in runs:
                    start = time.perf_counter()
                    for _ in range(per_round):
                        run["step"]()
                    run["ms"].append((time.perf_counter() - start) / per_round * 1e3)
            for run in runs:
                ratios = sorted(t / b for t, b in zip(run["ms"], runs[0]["ms"]))
                rows.append(dict(cls=cls_name, path=path, rev=run["rev"], commit=run["commit"],
                                 ms=sorted(run["ms"])[rounds // 2], ratio=ratios[rounds // 2],
                                 evals=run["opt"].num_evals))
    result = dict(quick=args.quick, machine=machine("cpu"), rounds=rounds, rows=rows)
    md = [f"# The shell's time per step by commit, interleaved in one process "
          f"({'quick' if args.quick else 'full'} run, cpu)", "",
          f"Machine: {result['machine']}", "",
          f"A 4-8-1 MLP on 16 samples, population 16, swim_length 4: each row is the median "
          f"ms per step over {rounds} rounds of {per_round} steps, and the median of the "
          "per-round ratios to the first commit.", "",
          "| class | path | commit | ms per step | ratio to first | evaluations |",
          "|---|---|---|---|---|---|"]
    md += [f"| {r['cls']} | {r['path']} | {r['rev']} ({r['commit'][:7]}) | {r['ms']:.2f} | "
           f"{r['ratio']:.3f} | {r['evals']} |" for r in rows]
    write(args, "compare_shell", result, md)


if __name__ == "__main__":
    main()
