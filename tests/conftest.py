import os

import torch


# The tiny models in these tests run far faster on one thread than on two contended ones (OpenMP waits dominate).
# Set OMP_NUM_THREADS to choose another count.
if "OMP_NUM_THREADS" not in os.environ:
    torch.set_num_threads(1)
