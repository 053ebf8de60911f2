#!/usr/bin/env bash
# On the GPU test machine (docs/gpu_machine.md), in the same device call as
# `bash benchmarks/gpu_setup.sh wheels` (random weights: no model file): the one-row layer
# kernel's GPU tests, its phases (with programmatic dependent launch and the --sweep of warps,
# tiles and combines), the embedded shape end to end at one sequence as the engine chooses at
# start (`--one-row auto`: the state line gives both timings), with the kernel forced on, off,
# and as the engine chooses but without programmatic dependent launch (`--no-one-row-pdl`);
# and where the model file is there, the real model's greedy tokens both ways.
#   bash benchmarks/gpu_setup.sh wheels > /dev/null && bash benchmarks/gpu_one_row.sh [PARTS]
# PARTS: any of tests, phases, batch, wide, 8b, contexts, tokens (default: tests phases batch
# wide tokens; they pass one call's 600 s: run "tests phases", "batch", "wide", "8b" and
# "contexts" as calls of their own). `wide`: Llama 3.2 1B's layers through the kernel (rows of
# 8,192; with the --sweep) against the compiled step's replay at one row; `8b` the same for the
# Llama-3-8B shape (rows of 14,336); `contexts`: the embedded shape's phases at 16, 100, 400
# and 1,600 cached positions (attention's cost a key, and its cost that keys do not explain).
# Each part's full output goes to $OUT; a summary line each is printed.
set -uo pipefail  # not -e: each part reports, the next still runs
export PYTHONPATH=$PWD/src:$PWD/benchmarks PYTHONUNBUFFERED=1
out=${OUT:-/tmp}
parts=${1:-tests phases batch wide tokens}
nvidia-smi --query-gpu=uuid --format=csv,noheader | tee "$out/gpu.txt"
has() { [[ " $parts " == *" $1 "* ]]; }
has tests && timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rs tests/kernels/test_decode_layer.py \
  tests/runtime_torch/test_one_row.py > "$out/one_row_tests.txt" 2>&1
has tests && tail -n 1 "$out/one_row_tests.txt"
has phases && timeout 300 python3 benchmarks/one_row_phases.py --preset gemma-3-270m --context 400 --sweep \
  > "$out/one_row_phases.txt" 2>&1
has phases && grep '^{' "$out/one_row_phases.txt"
has batch && for flag in "" "--one-row on" "--one-row off" "--no-one-row-pdl"; do
  name=one_row_batch$(tr ' -' '__' <<< "$flag")
  timeout 170 python3 benchmarks/torch_batch.py --preset gemma-3-270m --batches 1 --prompt 160 \
    $flag > "$out/$name.txt" 2>&1
  grep -E '^one-row kernel|^ +1 ' "$out/$name.txt" | head -n 2
done
for preset in llama-3.2-1b llama-3-8b; do  # part `wide`, part `8b`
  part=$([[ $preset == llama-3-8b ]] && echo 8b || echo wide)
  has "$part" || continue
  timeout 300 python3 benchmarks/one_row_phases.py --preset "$preset" --context 400 --sweep \
    > "$out/one_row_phases_$preset.txt" 2>&1
  grep '^{' "$out/one_row_phases_$preset.txt"
  timeout 200 python3 benchmarks/torch_step.py --preset "$preset" --batches 1 --context 400 \
    > "$out/torch_step_$preset.txt" 2>&1
  grep '^{' "$out/torch_step_$preset.txt" | head -n 2
done
if has contexts; then
  for context in 16 100 400 1600; do
    timeout 120 python3 benchmarks/one_row_phases.py --preset gemma-3-270m --context "$context" \
      > "$out/one_row_phases_context_$context.txt" 2>&1
    grep '^{' "$out/one_row_phases_context_$context.txt"
  done
fi
model=/tmp/model/gemma-3-270m-Q4_K_M.gguf  # gpu_setup.sh's, after the four chunk calls
if has tokens && [[ -f $model ]]; then
  timeout 240 python3 benchmarks/one_row_tokens.py --model "$model" > "$out/one_row_tokens.txt" 2>&1
  tail -n 3 "$out/one_row_tokens.txt"
elif has tokens; then
  echo "tokens: no $model (gpu_setup.sh's chunk calls put it there)"
fi
