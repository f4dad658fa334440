#!/usr/bin/env bash
# Fifth batch of held-out single-GPU steps: heads set apart from h / a with Qwen3's QK norm,
# separate projections and a parallel block (built by commbench --step's model for the first
# time), then the loss and QK-norm kernels (tools/kernel_probe.py --parts cross_entropy,qk_norm).
# Run from the repository root on a GPU machine; writes under $OUT.
source tools/step_batch.sh batch5 300
p=results/heldout5/plans
timeout 60 python3 tools/kernel_probe.py --output "$dir/probe_ce_qknorm.json" --parts cross_entropy,qk_norm 2>&1 | tail -3
one $p/qwen3-h1024-l28-s2048-b4.yaml 2 eager none 90
one $p/qwen3-h5120-l2-s4096-b1.yaml 2 eager none 90
one $p/llama-sep-h2048-l12-s2048-b4.yaml 2 eager none 90
one $p/gptj-h2048-l12-s2048-b4.yaml 2 eager none 90
one $p/qwen3-h2560-l8-s4096-b1.yaml 2 compiled none 150
one $p/qwen3-h1024-l28-s2048-b4.yaml 2 compiled none 150
tar -czf "$OUT/batch5.tar.gz" -C "$OUT" batch5
rm -rf "$dir"
