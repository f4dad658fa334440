#!/usr/bin/env bash
# Second batch of held-out H100 steps (run on a lent H100 from the repository root; writes under $OUT).
# GPT-style (LayerNorm, GeLU, biases, learned positions, tied head), selective recompute, and
# compiled steps at shapes no calibration or default was fitted on.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
dir=$OUT/batch2; mkdir -p "$dir"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv; python3 -c 'import torch; print(torch.__version__, torch.version.cuda)'; nproc; } >"$dir/gpu.txt" 2>&1
start=$SECONDS
one() {  # plan micro-batches eager|compiled trace? limit-s
    local plan=$1 mb=$2 mode=$3 trace=$4 limit=$5 name
    name=$(basename "$plan" .yaml)_mb${mb}_${mode}
    if (( SECONDS - start > 420 )); then echo "skipped $name: out of time"; return; fi
    local args=(--step "$plan" --microbatches "$mb" -o "$dir/step_$name.json")
    [[ $mode == compiled ]] && args+=(--compile)
    [[ $trace == trace ]] && args+=(--trace-out "$dir/trace_$name.json.gz")
    echo "== $name ($((SECONDS - start)) s)"
    timeout "$limit" python3 -m comm_bench "${args[@]}" >"$dir/$name.log" 2>&1
    echo "rc $? after $((SECONDS - start)) s"; tail -n 14 "$dir/$name.log"
    tar -czf "$OUT/batch2.tar.gz" -C "$OUT" batch2
}
p=results/h100_heldout/plans2; q=results/h100_heldout/plans
one $p/gpt-h768-l12-s1024-b8.yaml 4 eager trace 90
one $p/gpt-h2048-l16-s2048-b4.yaml 2 eager trace 90
one $p/llama-h4096-l6-s4096-b2-selective.yaml 1 eager none 90
one $p/gpt-h768-l12-s1024-b8.yaml 4 compiled trace 150
one $q/llama-h2048-l16-s2048-b4.yaml 2 compiled none 150
one $p/gpt-h2048-l16-s2048-b4.yaml 2 compiled trace 150
one $q/llama-h3072-l8-s4096-b1.yaml 2 compiled none 150
rm -rf "$dir"
