#!/usr/bin/env bash
# Held-out steps measured on a lent H200 (asked for an H100) (run on a lent H100 from the repository root; writes under $OUT).
# measured after the mechanisms read off batch 2 were written: new shapes, eager and compiled,
# full recompute, a launch-bound model.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
dir=$OUT/batch3; mkdir -p "$dir"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv; python3 -c 'import torch; print(torch.__version__, torch.version.cuda)'; nproc; } >"$dir/gpu.txt" 2>&1
start=$SECONDS
one() {  # plan micro-batches eager|compiled trace? limit-s
    local plan=$1 mb=$2 mode=$3 trace=$4 limit=$5 name
    name=$(basename "$plan" .yaml)_mb${mb}_${mode}
    if (( SECONDS - start > 300 )); then echo "skipped $name: out of time"; return; fi
    local args=(--step "$plan" --microbatches "$mb" -o "$dir/step_$name.json")
    [[ $mode == compiled ]] && args+=(--compile)
    [[ $trace == trace ]] && args+=(--trace-out "$dir/trace_$name.json.gz")
    echo "== $name ($((SECONDS - start)) s)"
    timeout "$limit" python3 -m comm_bench "${args[@]}" >"$dir/$name.log" 2>&1
    echo "rc $? after $((SECONDS - start)) s"; tail -n 14 "$dir/$name.log"
    tar -czf "$OUT/batch3.tar.gz" -C "$OUT" batch3
}
p=results/h200_heldout/plans
one $p/llama-h512-l8-s512-b16.yaml 4 eager none 90
one $p/mistral-h4096-l4-s4096-b2.yaml 2 eager none 90
one $p/gpt-h1280-l20-s1024-b8.yaml 2 eager none 90
one $p/llama-h1024-l16-s2048-b8-full.yaml 1 eager none 90
one $p/gpt-h1280-l20-s1024-b8.yaml 2 compiled none 150
one $p/llama-h2560-l12-s2048-b2.yaml 4 compiled none 150
one $p/llama-h512-l8-s512-b16.yaml 4 compiled none 120
rm -rf "$dir"
