import os

import torch
from hypothesis import settings

settings.register_profile("ci", max_examples=20, deadline=None, print_blob=True)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
