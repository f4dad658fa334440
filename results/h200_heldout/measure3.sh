#!/usr/bin/env bash
# Held-out steps at new shapes, eager and compiled, full recompute and a launch-bound model,
# measured after the mechanisms read off batch 2 were written (run from the repository root on a
# lent machine, which came up as an H200; writes under $OUT).
source tools/step_batch.sh batch3 300
p=results/h200_heldout/plans
one $p/llama-h512-l8-s512-b16.yaml 4 eager none 90
one $p/mistral-h4096-l4-s4096-b2.yaml 2 eager none 90
one $p/gpt-h1280-l20-s1024-b8.yaml 2 eager none 90
one $p/llama-h1024-l16-s2048-b8-full.yaml 1 eager none 90
one $p/gpt-h1280-l20-s1024-b8.yaml 2 compiled none 150
one $p/llama-h2560-l12-s2048-b2.yaml 4 compiled none 150
one $p/llama-h512-l8-s512-b16.yaml 4 compiled none 120
rm -rf "$dir"
