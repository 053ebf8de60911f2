"""The working directory the assistant may touch: path checks and the read-only tools.

Every path a model names goes through `resolve`, which refuses anything outside the folder.
"""

import os
from pathlib import Path

__all__ = ["MAX_LIST_ENTRIES", "MAX_READ_CHARS", "MAX_SEARCH_HITS", "ToolRefused", "Workspace"]

MAX_READ_CHARS = 40_000
MAX_LIST_ENTRIES = 400
MAX_SEARCH_HITS = 100
MAX_SEARCH_FILE_BYTES = 1_000_000
# Folders no one wants listed or searched; hidden folders (.git, .venv) are skipped as well.
_SKIPPED_DIRS = frozenset({"node_modules", "__pycache__", "venv", "build", "dist"})


class ToolRefused(Exception):
    """A tool call the assistant will not run; the message goes back to the model."""


class Workspace:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def resolve(self, path_text: str) -> Path:
        """The absolute path of `path_text`, which must lie inside the working directory.

        Resolving first means `..` and symbolic links cannot lead out of it.
        """
        text = path_text.strip().strip("`\"'")
        if not text:
            raise ToolRefused("no path given")
        path = (self.root / text).resolve()
        if not path.is_relative_to(self.root):
            raise ToolRefused(f"{text} is outside the working directory {self.root}; refused")
        return path

    def relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix() or "."

    def read_file(self, path_text: str) -> str:
        path = self.resolve(path_text)
        if not path.is_file():
            raise ToolRefused(f"{self.relative(path)} is not a file")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ToolRefused(f"{self.relative(path)} is not UTF-8 text") from None
        if len(text) > MAX_READ_CHARS:
            # Said in the result, so neither the model nor the user mistakes it for the whole.
            return (
                f"{text[:MAX_READ_CHARS]}\n[cut: showing the first {MAX_READ_CHARS:,} of "
                f"{len(text):,} characters]"
            )
        return text

    def project_files(self) -> list[Path]:
        """Every file of the working directory, as `list_files` walks it."""
        return self._files(self.root)

    def _files(self, folder: Path) -> list[Path]:
        found: list[Path] = []
        for directory, subdirs, names in os.walk(folder):
            subdirs[:] = sorted(
                d for d in subdirs if not d.startswith(".") and d not in _SKIPPED_DIRS
            )
            found.extend(Path(directory) / name for name in sorted(names))
        return found

    def list_files(self, folder_text: str) -> str:
        folder = self.resolve(folder_text) if folder_text.strip() else self.root
        if not folder.is_dir():
            raise ToolRefused(f"{self.relative(folder)} is not a folder")
        files = [self.relative(path) for path in self._files(folder)]
        shown = files[:MAX_LIST_ENTRIES]
        if len(files) > len(shown):
            shown.append(f"[cut: {len(shown)} of {len(files)} files listed]")
        return "\n".join(shown) if shown else "(no files)"

    def search_files(self, needle: str, folder_text: str) -> str:
        """Lines containing `needle` (plain text, case-sensitive) as path:line: text."""
        if not needle:
            raise ToolRefused("no text to search for")
        folder = self.resolve(folder_text) if folder_text.strip() else self.root
        hits: list[str] = []
        total = 0
        for path in self._files(folder):
            if path.stat().st_size > MAX_SEARCH_FILE_BYTES:
                continue
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except (UnicodeDecodeError, OSError):
                continue  # binary or unreadable: not text to search
            for number, line in enumerate(lines, start=1):
                if needle in line:
                    total += 1
                    if len(hits) < MAX_SEARCH_HITS:
                        hits.append(f"{self.relative(path)}:{number}: {line.strip()}")
        if total > len(hits):
            hits.append(f"[cut: {len(hits)} of {total} matching lines shown]")
        return "\n".join(hits) if hits else f"no line contains {needle!r}"
