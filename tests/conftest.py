import os

# Inductor compiles in this process, not in a pool of its own: each pool is a set of fresh
# processes that import torch, and on CI's two cores, both busy with xdist workers, it only
# adds that cost (test_contract alone, cold cache: 240 s -> 214 s wall, 240 -> 201 s CPU).
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch  # after the setting above, which inductor reads at import
from hypothesis import settings

settings.register_profile("ci", max_examples=20, deadline=None, print_blob=True)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# One thread a process under pytest-xdist (README's -n auto): a thread per core in all. Two
# processes of two threads on two cores oversubscribe them, and MKL then slows down by orders.
torch.set_num_threads(1 if "PYTEST_XDIST_WORKER" in os.environ
                      else max(1, min(2, torch.get_num_threads())))
