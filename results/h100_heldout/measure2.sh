#!/usr/bin/env bash
# Second batch of held-out H100 steps (run on a lent H100 from the repository root; writes under
# $OUT): GPT-style (LayerNorm, GeLU, biases, learned positions, tied head), selective recompute,
# and compiled steps at shapes no calibration or default was fitted on.
source tools/step_batch.sh batch2 420
p=results/h100_heldout/plans2; q=results/h100_heldout/plans
one $p/gpt-h768-l12-s1024-b8.yaml 4 eager trace 90
one $p/gpt-h2048-l16-s2048-b4.yaml 2 eager trace 90
one $p/llama-h4096-l6-s4096-b2-selective.yaml 1 eager none 90
one $p/gpt-h768-l12-s1024-b8.yaml 4 compiled trace 150
one $q/llama-h2048-l16-s2048-b4.yaml 2 compiled none 150
one $p/gpt-h2048-l16-s2048-b4.yaml 2 compiled trace 150
one $q/llama-h3072-l8-s4096-b1.yaml 2 compiled none 150
rm -rf "$dir"
