"""Writes tests/data/adapters_format1.pt: state dicts of the adapters' format 1.

Run at commit 47bd054, the last with format 1; kept to show how the fixture was made.
"""

import torch

from functional_bfo.adapters import BFO, AdaptiveBFO, HybridBFO


def record(cls):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
    b = torch.nn.Parameter(torch.tensor([0.3]), requires_grad=cls is HybridBFO)
    opt = cls([{"params": [w]}, {"params": [b], "elim_prob": 0.2}], population_size=4,
              swim_length=2, seed=7)

    def closure():
        opt.zero_grad()
        loss = (w - 0.25).square().sum() + (b + 1.0).square().sum()
        if cls is HybridBFO:
            loss.backward()
        return loss

    for _ in range(2):
        opt.step(closure)
    saved = opt.state_dict()
    params = [w.detach().clone(), b.detach().clone()]
    best = opt.step(closure)
    return {"state_dict": saved, "params": params, "next_best": best,
            "next_params": [w.detach().clone(), b.detach().clone()]}


torch.save({cls.__name__: record(cls) for cls in (BFO, AdaptiveBFO, HybridBFO)},
           "tests/data/adapters_format1.pt")
