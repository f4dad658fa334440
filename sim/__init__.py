"""commsim: a SimPy discrete-event simulator of GPU clusters, calibrated from measured collectives.

Torch-free: ``import sim`` and the ``commsim`` command never import torch.
"""
