"""What every benchmark shares: the command line, timing with device syncs, the machine, results.

Each script takes ``--quick`` (a smoke run of about a minute, executed by a CI test),
``--device`` (cpu or cuda) and writes ``benchmarks/results/<name>[_quick][_<device>].{json,md}``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable

import torch

from functional_bfo import random as fbr

RESULTS = pathlib.Path(__file__).parent / "results"


def parse(doc: str, *options: tuple[str, dict], cpu: bool = False, cold: bool = False
          ) -> argparse.Namespace:
    """The command line: --quick, --out, --device (``cpu``: none, the CPU) and ``options``, each
    ``(flag, add_argument's keywords)``. ``cold`` turns inductor's caches off for the process,
    so compile times are reported cold (with them a rerun would look almost free to compile)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a ~1 minute smoke run")
    p.add_argument("--out", type=pathlib.Path, default=RESULTS, help="results folder")
    for flag, settings in options + (() if cpu else (("--device", {
            "default": "cpu", "help": "cpu or cuda (default cpu)"}),)):
        p.add_argument(flag, **settings)
    if cold:
        import torch._inductor.config  # 1.3 s to import: only where a script compiles

        torch._inductor.config.force_disable_caches = True
        warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")  # says just that
    return p.parse_args(namespace=argparse.Namespace(device="cpu"))


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device: str = "cpu") -> tuple[object, float]:
    """``fn()`` and the wall seconds it took, the device synchronized before and after."""
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - start


def median_ms(fn: Callable[[], object], repeats: int, device: str = "cpu",
              warmup: int = 2, host: bool = False) -> float:
    """Median wall time of ``fn`` in ms, the device synchronized around every call; ``host``:
    only until ``fn`` returns, before waiting for the device (equal where the host is slower)."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        returned = time.perf_counter()
        sync(device)
        times.append((returned if host else time.perf_counter()) - start)
    return 1e3 * statistics.median(times)


def paired_ms(floor: Callable[[], object], work: Callable[[], object], repeats: int,
              device: str = "cpu", work_calls: int = 1) -> tuple[float, float, float]:
    """Median ms of ``floor`` and of ``work`` (per call of ``work_calls``), and the median
    of their per-repeat ratios: each repeat times one right after the other, so a burst of
    load on a shared machine moves both and the ratio stays put."""
    for _ in range(2):
        floor(), work()
    pairs = [(1e3 * timed(floor, device)[1], 1e3 * timed(work, device)[1] / work_calls)
             for _ in range(repeats)]  # floor, then work
    return (statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs),
            statistics.median(b / a for a, b in pairs))


def compiled(fn: Callable, mode: str) -> Callable:
    """``fn`` itself (``eager``), compiled whole (``compiled``) or in torch.compile's ``mode``."""
    return fn if mode == "eager" else torch.compile(
        fn, fullgraph=True, mode=None if mode == "compiled" else mode)


def machine(device: str) -> dict:
    gpu = {"gpu": torch.cuda.get_device_name()} if device.startswith("cuda") else {}
    return {"platform": platform.platform(), "processor": platform.processor() or "unknown",
            "cpu_threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "device": device, **gpu}


def write(args: argparse.Namespace, name: str, result: dict,
          markdown: list[str] | Callable[[dict], list[str]]) -> None:
    """Write ``<name>.json`` (compact: reruns keep results/ small), with the commit, machine and
    --quick, and ``<name>.md`` (lines: those under their title; a function: its lines of that
    whole result), suffixed by quick/device; print the table."""
    result = {"commit": commit(), "machine": machine(args.device), "quick": args.quick, **result}
    if callable(markdown):
        markdown = markdown(result)
    else:
        markdown[1:1] = ["", f"Commit `{result['commit']}`. Machine: {result['machine']}"]
    stem = name + ("_quick" if args.quick else "") + (
        "" if args.device == "cpu" else f"_{args.device.split(':')[0]}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(result, separators=(",", ":")) + "\n")
    text = "\n".join(markdown) + "\n"
    (args.out / f"{stem}.md").write_text(text)
    print(text)


def peak_mb(fn: Callable[[], object], device: str = "cpu") -> float:
    """Peak memory allocated while ``fn`` runs, above what was allocated before it, in MiB.
    CUDA: the caching allocator's peak. CPU: torch.profiler's allocations and frees summed in
    time order (an estimate: an op's own allocations and frees are netted at its start)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    changes = sorted((e.time_range.start, e.cpu_memory_usage if e.name == "[memory]"
                      else e.self_cpu_memory_usage) for e in profiled(fn, profile_memory=True))
    running = peak = 0
    for _, change in changes:
        running += change
        peak = max(peak, running)
    return peak / 2**20


def profiled(fn: Callable[[], object], device: str = "cpu", **settings):
    """torch.profiler's events (given ``settings``) of one call of ``fn``, on CUDA the GPU's too."""
    kinds = torch.profiler.ProfilerActivity
    with torch.profiler.profile(activities=[kinds.CPU] + [kinds.CUDA] * device.startswith("cuda"),
                                **settings) as prof:
        fn()
        sync(device)
    return prof.events()


def commit(root: pathlib.Path | None = None, form: str = "%h") -> str:
    """The last commit of ``root``'s checkout (default this one's) in git's ``form``;
    ``FB_COMMIT`` for this one where the tree travels without its history (a lent GPU)."""
    if root is None and (given := os.environ.get("FB_COMMIT")):
        return given
    try:
        out = subprocess.run(["git", "-C", str(root or RESULTS.parent), "log", "-1",
                              f"--format={form}"], capture_output=True, text=True)
    except OSError:  # no git
        return "unknown"
    return out.stdout.strip()[:72] or "unknown"


def baseline(root: pathlib.Path):
    """The core (``functional_bfo``) of another checkout ROOT, imported beside ours as
    ``baseline_functional_bfo``, and ROOT's last commit (hash, subject). It draws with this
    checkout's ``random`` (a custom op registers once per process), so ROOT's must be the same
    file: only the update differs."""
    folder, name = root.resolve() / "functional_bfo", "baseline_functional_bfo"
    if not (folder / "__init__.py").exists():
        raise SystemExit(f"--baseline {root}: no functional_bfo/__init__.py there.")
    if (folder / "random.py").read_text() != pathlib.Path(fbr.__file__).read_text():
        raise SystemExit(f"--baseline {root}: its functional_bfo/random.py differs from "
                         "this checkout's; the two cannot share one process.")
    sys.modules[f"{name}.random"] = fbr
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module, commit(root, "%h %s")


def table(header: str, rows) -> list[str]:
    """A Markdown table: ``header`` as ``"a | b | c"``, each row a sequence of cells."""
    return [f"| {header} |", "|" + "---|" * (header.count("|") + 1)] + [
        "| " + " | ".join(map(str, row)) + " |" for row in rows]
