#!/bin/bash
# Run on the lent GPU machine from the repository root: torch's CP ring on one rank and float8
# GEMMs with each scaling (tools/kernel_probe.py parts cp_ring, float8_gemm, sustained).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,memory.total --format=csv
  python -c 'import torch; print(torch.__version__, torch.version.cuda)'; nproc; } > "$OUT/gpu_cp_fp8.txt" 2>&1
timeout 400 python tools/kernel_probe.py --output "$OUT/probe_cp_fp8.json" \
  --parts cp_ring,float8_gemm,sustained --sustained-s 20 2>&1 | tail -40
