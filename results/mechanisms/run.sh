#!/bin/bash
# Run on the lent GPU machine from the repository root: kernel probes and peak memory of real steps.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
pip install --no-deps --target /tmp/site -q .device_wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,memory.total --format=csv > "$OUT/gpu.txt"
timeout 150 python tools/kernel_probe.py --output "$OUT/probe.json" --sustained-s 30 2>&1 | tail -8
for f in llama1b-s4096-b2_mb1_eager gpt2.7b-s2048-b2_mb4_eager llama8b-4layers-s8192-b1_mb1_eager \
         small-h1024-s1024-b4_mb1_eager llama13b-8layers-s4096-b2-full_mb1_eager llama1b-s4096-b2_mb4_eager; do
  read -r layers mb < <(python -c "
import json, yaml
d = json.load(open('refdata/h100/step_$f.json'))
yaml.safe_dump(d['plan'], open('/tmp/$f.yaml', 'w'))
print(d['measured_layers'], d['microbatches'])")
  timeout 100 python -m comm_bench --step /tmp/$f.yaml --layers "$layers" --microbatches "$mb" \
    --no-profile --output "$OUT/step_$f.json" 2>&1 | grep -E "peak|step " | head -3
done
f=llama1b-s4096-b2_mb4_eager
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 100 python -m comm_bench --step /tmp/$f.yaml \
  --layers 16 --microbatches 4 --no-profile --output "$OUT/step_${f}_expandable.json" 2>&1 | grep -E "peak|step "
