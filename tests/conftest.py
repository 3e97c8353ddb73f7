import torch

# Small-tensor CPU work is dominated by thread start-up: one intra-op thread
# is several times faster here (and is what the simulator uses).
torch.set_num_threads(1)
