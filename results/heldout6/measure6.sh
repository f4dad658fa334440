#!/usr/bin/env bash
# Sixth batch of held-out single-GPU steps, measured after the gap between kernels, the H200's
# elementwise rate, the composite QK norm and the autocast casts per linear were written: shapes
# that combine them (run from the repository root on a GPU machine; writes under $OUT).
source tools/step_batch.sh batch6 230
p=results/heldout6/plans
one $p/qwen3-sep-h2048-l16-s2048-b4.yaml 2 eager none 80
one $p/llama-pb-h3072-l8-s2048-b2.yaml 2 eager none 80
one $p/llama-sep-h1024-l16-s1024-b8.yaml 4 eager none 80
one $p/qwen3-h1536-l12-s4096-b1.yaml 2 compiled none 130
tar -czf "$OUT/batch6.tar.gz" -C "$OUT" batch6
rm -rf "$dir"
