"""commbench: measure collectives through torch.distributed, reported exactly like nccl-tests.

Only the measuring modules import torch; ``collectives`` and ``records`` (and the result
readers) are torch-free so that the simulator can use them.
"""
