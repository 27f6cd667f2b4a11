import os

import torch
from hypothesis import settings

settings.register_profile("ci", max_examples=20, deadline=None, print_blob=True)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# One thread a process under pytest-xdist (README's -n auto): a thread per core in all. Two
# processes of two threads on two cores oversubscribe them, and MKL then slows down by orders.
torch.set_num_threads(1 if "PYTEST_XDIST_WORKER" in os.environ
                      else max(1, min(2, torch.get_num_threads())))
