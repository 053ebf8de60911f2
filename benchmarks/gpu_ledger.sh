#!/usr/bin/env bash
# On the GPU test machine (docs/gpu_machine.md), after gpu_setup.sh: the step-ledger accounting
# under load, one step per device call.
#   bash benchmarks/gpu_ledger.sh serve     # serve_load.py on the torch engine, 1..64 clients
#   bash benchmarks/gpu_ledger.sh measure   # ipw measure --concurrency 32 against torch_batch.py,
#                                           # and its task phase against the generations alone
# With EAGER_PREFILL=1, the server's torch engine runs prefill steps eagerly, not from CUDA
# graphs (its files are named _eager_prefill). SRC=DIR runs another tree's src/ (an A/B against
# an older commit: `git archive REV src | tar -x -C DIR`), its files named with TAG=NAME. With
# PROFILE=1, `measure` also records py-spy (raw stacks, every process) of torch_batch.py at 32
# and of measure_phase.py's generations alone: where the engine's process spends a step in each.
set -euo pipefail
export PYTHONPATH=${SRC:-$PWD}/src PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
model=/tmp/model/gemma-3-270m-Q4_K_M.gguf
out=${OUT:-/tmp}
tag=${TAG:+_$TAG}
serve_flags=()
if [ -n "${EAGER_PREFILL:-}" ]; then
  serve_flags=(--eager-prefill)
  tag="${tag}_eager_prefill"
fi
case "${1:-}" in
  serve)
    python3 benchmarks/serve_load.py --engine torch --model "$model" --clients 1,8,32,64 \
      --seconds 15 --scope accelerator --idle-seconds 5 --mixed "${serve_flags[@]}" \
      --profile "$out/serve_profile$tag.txt" \
      2>&1 | tee "$out/serve_load$tag.txt"
    ;;
  measure)
    spy=()
    if [ -n "${PROFILE:-}" ]; then
      spy=(py-spy record --subprocesses --rate 250 --format raw --output)
    fi
    python3 benchmarks/torch_batch.py --preset "$model" --batches 1,32 --prompt 160 \
      --tokens 256 --out "$out/torch_batch$tag.json" 2>&1 | tail -n 20 | tee "$out/torch_batch$tag.txt"
    if [ -n "${PROFILE:-}" ]; then
      "${spy[@]}" "$out/torch_batch_profile$tag.txt" -- python3 benchmarks/torch_batch.py \
        --preset "$model" --batches 32 --prompt 160 --tokens 256 >/dev/null 2>&1
    fi
    SECONDS=0
    python3 -m openjarvis measure --engine torch --model "$model" --all --concurrency 32 \
      --scope accelerator --idle-seconds 5 --db /tmp/ledger$tag.db --json > "$out/measure$tag.json" \
      2> >(tee "$out/measure_err$tag.txt" >&2)
    echo "ipw measure took ${SECONDS} s (engine start and idle included)"
    python3 - "$out/measure$tag.json" /tmp/ledger$tag.db <<'PY'
import json, sqlite3, statistics, sys
summary = json.load(open(sys.argv[1]))
rates = [r for (r,) in sqlite3.connect(sys.argv[2]).execute(
    "select decode_tokens_per_s from task_result where decode_tokens_per_s is not null")]
print("per-sequence decode tok/s: median", statistics.median(rates), "mean", statistics.mean(rates))
for key in ("concurrency", "conservation", "accuracy", "joules_per_task"):
    print(key, json.dumps(summary.get(key)))
PY
    # The task phase against the same generations alone (no windows, no scoring).
    python3 benchmarks/measure_phase.py --db /tmp/ledger$tag.db \
      2>&1 | grep -v '^llama_context' | tee "$out/measure_phase$tag.txt"
    if [ -n "${PROFILE:-}" ]; then
      "${spy[@]}" "$out/measure_phase_profile$tag.txt" -- python3 benchmarks/measure_phase.py \
        --db /tmp/ledger$tag.db >/dev/null 2>&1
    fi
    ;;
  *)
    echo "usage: $0 serve | measure" >&2
    exit 2
    ;;
esac
