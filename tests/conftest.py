import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # tests import reference_hept

import torch

# The suite is many small tensor ops: one intra-op thread avoids OpenMP barrier stalls on
# small shared machines (2 cores in CI) and keeps timings stable.
torch.set_num_threads(1)
