"""The compute model: prices kernels on one GPU.

``model`` (``ComputeModel``) turns a kernel (FLOPs, dimensions, bytes, dtype) into seconds with a
roofline and shape-dependent efficiency, default or calibrated, and prices the kernel lists
``schedules.kernels`` describes for a layer, the embedding and the head. It never calls back into
the description. Imports ``topologies``, ``schedules`` and ``vocab.compute_calibration``;
nothing else from ``sim``.
"""
