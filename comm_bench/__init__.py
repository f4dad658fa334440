"""commbench: measure collectives through torch.distributed, reported exactly like nccl-tests.

Only the measuring modules import torch. What the simulator shares with it (collective
definitions, records, results files, the nccl-tests table, the compute calibration file) lives
below both, in ``vocab``.
"""
