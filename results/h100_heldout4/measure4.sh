#!/usr/bin/env bash
# Fourth batch of held-out single-GPU steps, at shapes no default or calibration has seen, measured
# after the launches known per kernel (cuBLAS memsets, the eager grouped-query repeat, autocast's
# bias casts) were written (run from the repository root on a lent machine; writes under $OUT).
source tools/step_batch.sh batch4 330
p=results/h100_heldout4/plans
one $p/llama-h1792-l14-s2048-b4.yaml 2 eager none 90
one $p/llama-h768-l12-s1024-b16.yaml 4 eager none 90
one $p/qwen-h3584-l6-s4096-b1.yaml 2 compiled none 150
one $p/gpt-h1536-l24-s1024-b8-selective.yaml 2 eager none 90
one $p/llama-h5120-l4-s2048-b2-full.yaml 1 eager none 90
one $p/gpt-h2560-l8-s2048-b4.yaml 2 eager none 90
one $p/llama-h768-l12-s1024-b16.yaml 4 compiled none 120
rm -rf "$dir"
