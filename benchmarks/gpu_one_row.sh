#!/usr/bin/env bash
# On the GPU test machine (docs/gpu_machine.md), in the same device call as
# `bash benchmarks/gpu_setup.sh wheels` (random weights: no model file): the one-row layer
# kernel's GPU tests, its phases (with programmatic dependent launch and the --sweep of warps
# and tiles), the embedded shape end to end at one sequence with it and without, and where the
# model file is there, the real model's greedy tokens both ways.
#   bash benchmarks/gpu_setup.sh wheels > /dev/null && bash benchmarks/gpu_one_row.sh
# Each part's full output goes to $OUT; a summary line each is printed.
set -uo pipefail  # not -e: each part reports, the next still runs
export PYTHONPATH=$PWD/src:$PWD/benchmarks PYTHONUNBUFFERED=1
out=${OUT:-/tmp}
nvidia-smi --query-gpu=uuid --format=csv,noheader | tee "$out/gpu.txt"
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rs tests/kernels/test_decode_layer.py \
  tests/runtime_torch/test_one_row.py > "$out/one_row_tests.txt" 2>&1
tail -n 1 "$out/one_row_tests.txt"
timeout 150 python3 benchmarks/one_row_phases.py --preset gemma-3-270m --context 400 --sweep \
  > "$out/one_row_phases.txt" 2>&1
grep '^{' "$out/one_row_phases.txt"
for flag in "" --no-one-row; do
  name=one_row_batch${flag:+_off}
  timeout 170 python3 benchmarks/torch_batch.py --preset gemma-3-270m --batches 1 --prompt 160 \
    $flag > "$out/$name.txt" 2>&1
  grep -E '^ +1 ' "$out/$name.txt" | head -n 1
done
