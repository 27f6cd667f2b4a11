"""Update times of several commits side by side: interleaved in one process, as ratios.

Timing two versions in separate processes on a shared machine mixes the change with the
machine's drift (this 2-core VM moved one floor by 2x between runs). Here each commit's
``functional_bfo`` is extracted with ``git archive`` into a temporary folder under a
package name of its own (its ``torch.library`` namespace renamed so that every copy can
register its ops), every copy builds the same optimizer on the same problem, and rounds
of updates alternate between the copies. The table gives each commit's median ms per
update and the median of its per-round ratios to the first commit, with each copy's best
loss (equal when the change keeps the trajectory). ``--mode eager`` writes
``compare_commits_eager.{json,md}``, so both modes' records can stand side by side;
``--name`` gives a record a name of its own. A development tool: records go to
``dev/results`` (not the user-facing ``benchmarks/results``).

    python dev/compare_commits.py 08ff3b0 HEAD [--mode eager] [--variants bfo,...]
"""

from __future__ import annotations

import importlib
import io
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from common import machine, parser, write  # noqa: E402
from update_overhead import mlp_problem, rastrigin_problem  # noqa: E402

PROBLEMS = {"rastrigin-30": (lambda: rastrigin_problem(30, "cpu"), 256, 50),
            "mlp-64-128-10": (lambda: mlp_problem((64, 128, 10), 256, "cpu"), 64, 5)}


def extract(rev: str, name: str, into: Path) -> str:
    """``functional_bfo`` at ``rev`` as package ``name`` in ``into``; the full commit id."""
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=REPO,
                            check=True, capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "archive", commit, "functional_bfo", "adapters"],
                             cwd=REPO, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into / "_archive", filter="data")
    (into / "_archive" / "functional_bfo").rename(into / name)
    (into / "_archive" / "adapters").rename(into / name / "adapters")  # as installed
    source = into / name / "_threefry.c"
    if source.exists():  # the opt-in C kernel, built as FUNCTIONAL_BFO_C=1 would
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        subprocess.run(["cc", "-O3", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}",
                        str(source), "-o", str(into / name / f"_threefry{suffix}")], check=True)
    for path in (into / name).rglob("*.py"):
        text = path.read_text()
        for old, new in (('"functional_bfo"', f'"{name}"'), ("functional_bfo::", f"{name}::"),
                         ("torch.ops.functional_bfo", f"torch.ops.{name}"),
                         ("import functional_bfo as", f"import {name} as"),
                         ("from functional_bfo.", f"from {name}.")):
            text = text.replace(old, new)
        path.write_text(text)
    return commit


def main() -> None:
    p = parser(__doc__)
    p.add_argument("revs", nargs="+", help="commits to compare; the first is the baseline")
    p.add_argument("--mode", choices=["compiled", "eager"], default="compiled")
    p.add_argument("--variants", default="bfo,adaptive_bfo,hybrid_bfo")
    p.add_argument("--problems", default=",".join(PROBLEMS))
    p.add_argument("--name", help="results file name (default compare_commits[_eager])")
    p.set_defaults(out=REPO / "dev" / "results")
    args = p.parse_args()
    if args.device != "cpu":
        p.error("compare_commits.py times the CPU only")
    rounds = 3 if args.quick else 20
    folder = Path(tempfile.mkdtemp(prefix="fb-commits-"))
    sys.path.insert(0, str(folder))
    packages = []  # (rev, package, commit), in the order given
    for i, rev in enumerate(args.revs):
        commit = extract(rev, f"fb_commit_{i}", folder)
        packages.append((rev, importlib.import_module(f"fb_commit_{i}"), commit))

    rows = []
    for problem in args.problems.split(","):
        make_problem, population, per_round = PROBLEMS[problem]
        params, loss, extra = make_problem()
        for variant in args.variants.split(","):
            kwargs = dict(population_size=population, swim_length=4, chemotaxis_steps=10,
                          **extra, **({"grad_mask": True} if variant == "hybrid_bfo" else {}))
            runs = []
            for rev, fb, commit in packages:
                opt = getattr(fb, variant)(**kwargs)
                update = (torch.compile(opt.update, fullgraph=True)
                          if args.mode == "compiled" else opt.update)
                state = opt.init(params, key=fb.random.key(0))
                for _ in range(12):  # compile, and run past the first reproduction
                    state = update(state, loss)
                runs.append({"rev": rev, "commit": commit, "update": update, "state": state,
                             "ms": []})
            for _ in range(rounds):
                for run in runs:
                    state, start = run["state"], time.perf_counter()
                    for _ in range(per_round):
                        state = run["update"](state, loss)
                    float(state.best_loss)  # wait for the last update
                    run["ms"].append((time.perf_counter() - start) / per_round * 1e3)
                    run["state"] = state
            for run in runs:
                ratios = sorted(t / b for t, b in zip(run["ms"], runs[0]["ms"]))
                rows.append(dict(problem=problem, variant=variant, rev=run["rev"],
                                 commit=run["commit"], ms=sorted(run["ms"])[rounds // 2],
                                 ratio=ratios[rounds // 2],
                                 best_loss=float(run["state"].best_loss)))

    result = dict(quick=args.quick, mode=args.mode, machine=machine("cpu"), rounds=rounds,
                  rows=rows)
    md = [f"# {args.mode.capitalize()} update time by commit, interleaved in one process "
          f"({'quick' if args.quick else 'full'} run, cpu)", "",
          f"Machine: {result['machine']}", "",
          f"Each row: the median ms per update over {rounds} rounds, and the median of the "
          "per-round ratios to the first commit (rounds alternate between commits). The "
          "best loss after the same number of updates shows whether the trajectory changed.",
          "", "| problem | variant | commit | ms | ratio to first | best loss |",
          "|---|---|---|---|---|---|"]
    md += [f"| {r['problem']} | {r['variant']} | {r['rev']} ({r['commit'][:7]}) | "
           f"{r['ms']:.3f} | {r['ratio']:.3f} | {r['best_loss']:.6g} |" for r in rows]
    name = args.name or "compare_commits" + ("" if args.mode == "compiled" else "_eager")
    write(args, name, result, md)


if __name__ == "__main__":
    main()
