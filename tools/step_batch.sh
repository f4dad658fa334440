# Shared harness of a batch of `commbench --step` runs on a GPU machine (sourced from the
# repository root; writes under $OUT). Usage, in the batch's own script:
#   source tools/step_batch.sh NAME BUDGET_S     # $OUT/NAME/ and $OUT/NAME.tar.gz; no new run
#   one PLAN MICROBATCHES eager|compiled trace|none LIMIT_S   # starts after BUDGET_S seconds
# Each run's JSON, log and (with `trace`) Chrome trace land in $OUT/NAME; the folder is re-tarred
# after every run, so what finished comes back even when the machine's time runs out.
set -u
batch=$1 budget=$2
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
dir=$OUT/$batch; mkdir -p "$dir"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv; python3 -c 'import torch; print(torch.__version__, torch.version.cuda)'; nproc; } >"$dir/gpu.txt" 2>&1
start=$SECONDS
one() {  # plan micro-batches eager|compiled trace|none limit-s
    local plan=$1 mb=$2 mode=$3 trace=$4 limit=$5 name
    name=$(basename "$plan" .yaml)_mb${mb}_${mode}
    if (( SECONDS - start > budget )); then echo "skipped $name: out of time"; return; fi
    local args=(--step "$plan" --microbatches "$mb" -o "$dir/step_$name.json")
    [[ $mode == compiled ]] && args+=(--compile)
    [[ $trace == trace ]] && args+=(--trace-out "$dir/trace_$name.json.gz")
    echo "== $name ($((SECONDS - start)) s)"
    timeout "$limit" python3 -m comm_bench "${args[@]}" >"$dir/$name.log" 2>&1
    echo "rc $? after $((SECONDS - start)) s"; tail -n 14 "$dir/$name.log"
    tar -czf "$OUT/$batch.tar.gz" -C "$OUT" "$batch"
}
