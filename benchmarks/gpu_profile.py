"""Where an eager update's time goes: ops dispatched, kernel launches, host syncs.

``fb.bfo``, ``fb.adaptive_bfo`` and ``fb.hybrid_bfo`` (``grad_mask=True``) on ``gpu.py``'s
Rastrigin (swim length 4), eager, P = 256 and 65,536, per update over a cycle of chained
updates: wall ms; host ms (before the final sync: equal to ms where the host is the
bottleneck); ops (profiler's aten events at the top of their stack); kernel launches; syncing
runtime calls (less an empty cycle's); host-device copies; the GPU's kernel time; and the op
floor, ops x the time of one small eager op. On the CPU it counts the ops and the host's time.

    python benchmarks/gpu_profile.py --device cuda [--quick]
"""

from __future__ import annotations

import collections

import torch
from common import median_ms, parse, profiled, table, write
from problems import CYCLE, FACTORIES, cycle, rastrigin_problem, started

SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def inside_op(event) -> bool:
    """Whether an aten op encloses ``event`` (so it is not a dispatched op of its own)."""
    parent = event.cpu_parent
    while parent is not None and not parent.name.startswith("aten::"):
        parent = parent.cpu_parent
    return parent is not None


def profile_counts(run, device: str) -> dict:
    """Ops, launches, syncs, copies and GPU time per update of one profiled cycle."""
    events = profiled(run, device)
    own = collections.Counter(e.name for e in profiled(lambda: None, device))
    gpu = torch.autograd.DeviceType.CUDA
    top_ops = [e for e in events if e.name.startswith("aten::") and e.device_type != gpu
               and not inside_op(e)]
    names = collections.Counter(e.name for e in events if e.device_type != gpu)
    return {"ops": len(top_ops) / CYCLE,
            "launches": sum(n for name, n in names.items() if name.startswith("cuLaunchKernel")
                            or name in ("cudaLaunchKernel", "cudaLaunchKernelExC")) / CYCLE,
            "syncs": {name: (names[name] - own[name]) / CYCLE for name in SYNCS
                      if names[name] > own[name]},
            "memcpy_async": names["cudaMemcpyAsync"] / CYCLE,
            "gpu_us": sum(e.time_range.elapsed_us() for e in events if e.device_type == gpu)
            / CYCLE, "top_ops": collections.Counter(e.name for e in top_ops).most_common(12)}


def op_us(device: str, repeats: int) -> float:
    """Time of one small eager op (``x.add_(1)``), in us: what dispatch and a launch cost."""
    x = torch.zeros(256, device=device)

    def ops():
        for _ in range(1000):
            x.add_(1)

    return median_ms(ops, repeats, device)


def row(variant: str, population: int, device: str, repeats: int) -> dict:
    problem = rastrigin_problem(30, device)
    opt, state = started(variant, population, problem)
    run = cycle(opt.update, state, problem[1])
    run()
    return {"variant": variant, "population": population,
            "ms": median_ms(run, repeats, device) / CYCLE,
            "host_ms": median_ms(run, repeats, device, host=True) / CYCLE,
            **profile_counts(run, device)}


def markdown(result: dict) -> list[str]:
    op_us = result["op_us"]
    return [f"# Where an eager update's time goes ({result['machine'].get('gpu', 'cpu')})", "",
            f"Commit `{result['commit']}`, torch {result['machine']['torch']}. One small eager "
            f"op: {op_us:.1f} us. Per update, chained over {CYCLE} updates:", ""] + table(
        "variant | P | ms | host ms | ops | op floor ms | launches | syncs | copies | GPU us", [
            [r["variant"], r["population"], f"{r['ms']:.2f}", f"{r['host_ms']:.2f}",
             f"{r['ops']:.0f}", f"{r['ops'] * op_us / 1e3:.2f}", f"{r['launches']:.0f}",
             f"{sum(r['syncs'].values()):.1f}", f"{r['memcpy_async']:.1f}", f"{r['gpu_us']:.0f}"]
            for r in result["rows"]])


def main() -> None:
    args = parse(__doc__)
    repeats, populations = (3, (32,)) if args.quick else (15, (256, 65536))
    write(args, "gpu_profile", {"op_us": op_us(args.device, repeats), "rows": [
        row(v, p, args.device, repeats) for p in populations for v in FACTORIES]}, markdown)


if __name__ == "__main__":
    main()
