#!/usr/bin/env bash
# On the GPU test machine (docs/gpu_machine.md), after gpu_setup.sh: the GPU-marked tests and the
# prompt-reuse benchmark on CUDA, in one device call.
#   bash benchmarks/gpu_tests.sh    # writes kernels.txt, prefix_test.txt, prefix.txt/json to $OUT
set -uo pipefail  # not -e: each part reports, the next still runs
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
model=/tmp/model/gemma-3-270m-Q4_K_M.gguf
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -m pytest -m gpu -p no:cacheprovider -q -rs tests/kernels/test_gpu_kernels.py \
  tests/kernels/test_decode_layer.py tests/runtime_torch/test_one_row.py \
  tests/runtime_torch/test_decode_roofline.py \
  tests/runtime_torch/test_prefill_graphs.py 2>&1 | tail -n 25 | tee "$out/kernels.txt"
python3 -m pytest -p no:cacheprovider -q -rs tests/runtime_torch/test_prefix_cache.py \
  tests/runtime_torch/test_mixed_steps.py -k cuda 2>&1 \
  | tail -n 15 | tee "$out/prefix_test.txt"
python3 benchmarks/assistant_prefix.py --engine torch --model "$model" --out "$out/prefix.json" \
  2>&1 | tail -n 25 | tee "$out/prefix.txt"
