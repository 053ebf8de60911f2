"""GGUF files already downloaded into the user's Hugging Face cache, found without the network.

The cache is HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub, laid out as
models--ORG--REPO/snapshots/REVISION/FILE; the revision that refs/main names wins.
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path

from openjarvis.paths import user_cache_dir

__all__ = ["CachedGguf", "cached_ggufs", "hub_cache_dir"]

# Sharded GGUFs are named NAME-00001-of-00003.gguf; the first shard stands for the model.
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})$")


@dataclass(frozen=True, slots=True)
class CachedGguf:
    name: str  # "ORG/REPO/FILE-STEM", what `--model` accepts
    path: Path  # the first shard for a sharded model
    size_bytes: int  # all shards together


def hub_cache_dir() -> Path:
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    hf_home = os.environ.get("HF_HOME")
    if hf_home:
        return Path(hf_home).expanduser() / "hub"
    return user_cache_dir() / "huggingface" / "hub"


def _current_snapshot(repo_dir: Path) -> Path | None:
    snapshots = repo_dir / "snapshots"
    try:
        revision = (repo_dir / "refs" / "main").read_text().strip()
        if (snapshots / revision).is_dir():
            return snapshots / revision
    except OSError:
        pass  # no refs/main (downloaded by revision): take the newest snapshot
    candidates = [p for p in snapshots.iterdir() if p.is_dir()] if snapshots.is_dir() else []
    return max(candidates, key=lambda p: p.stat().st_mtime, default=None)


def _models_in(snapshot: Path, repo: str) -> list[CachedGguf]:
    found = []
    for path in sorted(snapshot.rglob("*.gguf")):
        if not path.is_file():  # a dangling symlink: the blob was deleted
            continue
        stem = path.name[: -len(".gguf")]
        shard = _SHARD.search(stem)
        size = path.stat().st_size
        if shard:
            if int(shard.group(1)) != 1:
                continue
            pattern = f"{stem[: shard.start()]}-*-of-{shard.group(2)}.gguf"
            size = sum(p.stat().st_size for p in path.parent.glob(pattern) if p.is_file())
            stem = stem[: shard.start()]
        found.append(CachedGguf(f"{repo}/{stem}", path, size))
    return found


def cached_ggufs(cache_dir: Path | None = None) -> list[CachedGguf]:
    """Every GGUF in the current snapshot of each cached model repository, sorted by name."""
    root = cache_dir or hub_cache_dir()
    if not root.is_dir():
        return []
    found: list[CachedGguf] = []
    for repo_dir in sorted(root.glob("models--*")):
        snapshot = _current_snapshot(repo_dir)
        if snapshot is not None:
            repo = repo_dir.name[len("models--") :].replace("--", "/")
            found.extend(_models_in(snapshot, repo))
    return found
