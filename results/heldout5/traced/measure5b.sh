#!/usr/bin/env bash
# Paired traces for batch 5's two eager misses: separate projections against the fused ones, a
# parallel block against the sequential one, same shapes (run from the repository root on a GPU
# machine; writes under $OUT).
source tools/step_batch.sh batch5b 240
p=results/heldout5/plans
one $p/llama-sep-h2048-l12-s2048-b4.yaml 2 eager trace 90
one $p/llama-fused-h2048-l12-s2048-b4.yaml 2 eager trace 90
one $p/gptj-h2048-l12-s2048-b4.yaml 2 eager trace 90
one $p/gpt-seq-h2048-l12-s2048-b4.yaml 2 eager trace 90
tar -czf "$OUT/batch5b.tar.gz" -C "$OUT" batch5b
rm -rf "$dir"
