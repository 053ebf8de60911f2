"""A first run of llama.cpp in a child process before our own process loads it, so that a build
this CPU cannot execute (an illegal instruction, a segfault) is one clear line, not a silent death.

llama.cpp compiled with `-march=native` uses every instruction the build machine's CPUID reports;
in some VMs and containers AMX or AVX-512 is reported but faults (SIGILL). A signal kills the
whole Python process with no output, so the first load of each (library, CPU, model) is tried in
a child; a pass is remembered in the user cache and costs nothing afterwards.
"""

import hashlib
import importlib.util
import platform
import signal
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from openjarvis.errors import UserError
from openjarvis.paths import user_cache_dir

__all__ = ["check_llama_cpp_runs", "portable_build_command"]

# Long enough to load a multi-GB model from a cold disk; the probe itself generates 2 tokens.
_PROBE_TIMEOUT_S = 600.0
# About 70 tokens: prefill goes through the batched matrix kernels (where AMX code sits), not
# only the one-token decode path.
_PROBE_PROMPT = "def add(a, b):\n    return a + b\n\n" * 6


def portable_build_command() -> str:
    """The reinstall that builds llama.cpp for any x86-64 CPU with AVX2 (no AMX or AVX-512)."""
    try:
        version = f"=={metadata.version('llama-cpp-python')}"
    except metadata.PackageNotFoundError:
        version = ""
    return (
        'CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF" pip install --force-reinstall '
        f"--no-cache-dir --no-deps llama-cpp-python{version}"
    )


def _library_files() -> list[Path]:
    """llama-cpp-python's shared libraries, found without importing (importing loads them)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return []
    package = Path(next(iter(spec.submodule_search_locations)))
    return sorted(p for p in package.rglob("*") if p.suffix in (".so", ".dylib", ".dll"))


def _cpu_identity() -> str:
    """The CPU's model name and feature flags: a build that runs on one may fault on another."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = ("model name", "flags", "Features", "CPU implementer", "CPU part")
    lines = [line for line in text.splitlines() if line.split(":")[0].strip() in wanted]
    return "\n".join(sorted(set(lines)))


def _probe_key(model_path: Path, n_gpu_layers: int) -> str:
    digest = hashlib.sha256()
    for path in [*_library_files(), model_path]:
        stat = path.stat()
        digest.update(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    digest.update(f"{_cpu_identity()}\n{n_gpu_layers}\n{sys.executable}".encode())
    return digest.hexdigest()[:32]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _crash_message(signal_number: int, model_path: Path) -> str:
    name = _signal_name(signal_number)
    if name == "SIGILL":
        return (
            "llama.cpp crashed with SIGILL (illegal instruction) on a test run here: it was built "
            "for instructions this CPU reports but cannot run (AMX or AVX-512 in many VMs); "
            f"rebuild it for any x86-64 CPU: {portable_build_command()}"
        )
    return (
        f"llama.cpp crashed with {name} on a test run of {model_path} here; rebuild it "
        f"({portable_build_command()}) and, if it still crashes, check the model file"
    )


def check_llama_cpp_runs(model_path: Path, n_gpu_layers: int = 0) -> None:
    """Raise a UserError if llama.cpp dies by a signal loading `model_path` and generating.

    Any other failure in the child (a damaged file, a missing package) is left to the load in
    our own process, which reports it as usual.
    """
    marker = (
        user_cache_dir() / "openjarvis" / "llamacpp-probe" / _probe_key(model_path, n_gpu_layers)
    )
    if marker.exists():
        return
    command = [sys.executable, "-m", __name__, str(model_path), str(n_gpu_layers)]
    try:
        child = subprocess.run(command, capture_output=True, timeout=_PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return  # a slow disk is not a crash; the real load goes ahead
    if child.returncode < 0:
        raise UserError(_crash_message(-child.returncode, model_path))
    if child.returncode == 0:
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        except OSError:
            pass  # an unwritable cache only means probing again next time


def _probe(model_path: str, n_gpu_layers: int) -> None:
    """The child's side: load the model, prefill a short prompt, decode two tokens."""
    import llama_cpp

    llama = llama_cpp.Llama(
        model_path=model_path, n_ctx=256, n_gpu_layers=n_gpu_layers, verbose=False
    )
    llama.create_completion(_PROBE_PROMPT, max_tokens=2, temperature=0.0)


if __name__ == "__main__":
    _probe(sys.argv[1], int(sys.argv[2]))
