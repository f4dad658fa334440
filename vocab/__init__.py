"""vocab: the shared vocabulary of commbench and commsim, torch-free and below both.

What the benchmark measures and the simulator models in the same words: the collectives and
their nccl-tests arithmetic (``collectives``), sizes as nccl-tests writes them (``sizes``), one
result record (``records``), the results files written (``writer``) and read back
(``readers``: commbench JSON/CSV, nccl-tests logs, busbw tables), the nccl-tests table
(``nccl_table``), the compute calibration file (``compute_calibration``), the kernel classes
of a profiled step (``kernel_classes``) and torch.profiler traces of a training step
(``kineto`` reads one, ``trace_summary`` sums its step). Imports nothing from the project but
``fileio``.

    from vocab.readers import read_results; records = read_results("results/commbench/run.json")
"""
