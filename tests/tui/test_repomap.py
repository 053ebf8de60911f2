"""The repository map: each file's definitions with their signatures (Python by ast; JavaScript,
TypeScript, Go and Rust by tree-sitter), ranked by how many other files use them, cut to a token
budget, and in the system prompt the model sees."""

from pathlib import Path

import pytest

from openjarvis.store import Store
from openjarvis.tui.chat import Chat
from openjarvis.tui.conversation import estimate_tokens
from openjarvis.tui.repomap import HEADER, file_definitions, repo_map

PYTHON = """
import os

class Store(Base):
    def save(self, record: dict, *, commit: bool = True) -> int:
        def helper():  # inside a function: not part of the map
            pass
        return 1

    async def close(self) -> None: ...

def open_store(url: str) -> "Store":
    return Store()
"""


def _signatures(path: str, text: str) -> list[tuple[int, str]]:
    found = file_definitions(path, text)
    assert found is not None
    return [(d.depth, d.signature) for d in found]


def test_python_definitions_with_their_signatures() -> None:
    assert _signatures("store.py", PYTHON) == [
        (0, "class Store(Base)"),
        (1, "def save(self, record: dict, *, commit: bool=True) -> int"),
        (1, "async def close(self) -> None"),
        (0, "def open_store(url: str) -> 'Store'"),
    ]
    assert file_definitions("broken.py", "def (:") == []
    assert file_definitions("notes.txt", "def x(): pass") is None  # not a language it reads


def test_other_languages_through_tree_sitter() -> None:
    pytest.importorskip("tree_sitter_typescript")
    pytest.importorskip("tree_sitter_go")
    pytest.importorskip("tree_sitter_rust")
    typescript = "export class Cart {\n  total(tax: number): number { return 1 }\n}\n"
    typescript += "export const add = (a: number) => a + 1;\ninterface Item { id: string }\n"
    assert _signatures("cart.ts", typescript) == [
        (0, "class Cart"),
        (1, "total(tax: number): number"),
        (0, "add = (a: number) => a + 1"),
        (0, "interface Item"),
    ]
    go = "package cart\nfunc Add(a, b int) int { return a + b }\nfunc (c *Cart) Total() int {}\n"
    assert _signatures("cart.go", go) == [
        (0, "func Add(a, b int) int"),
        (0, "func (c *Cart) Total() int"),
    ]
    rust = "pub struct Cart { n: i32 }\nimpl Cart {\n    pub fn total(&self) -> i32 { 1 }\n}\n"
    assert _signatures("cart.rs", rust) == [
        (0, "pub struct Cart"),
        (0, "impl Cart"),
        (1, "pub fn total(&self) -> i32"),
    ]


def _project(root: Path) -> list[Path]:
    (root / "store.py").write_text(PYTHON)
    (root / "unused.py").write_text("def lonely_helper(x):\n    return x\n")
    for index in range(3):
        (root / f"user_{index}.py").write_text("from store import open_store\nopen_store('x')\n")
    return sorted(root.glob("*.py"))


def test_the_most_used_come_first_and_the_map_fits_its_budget(tmp_path: Path) -> None:
    files = _project(tmp_path)
    whole = repo_map(files, tmp_path, 1000)
    assert whole.splitlines()[:2] == [HEADER, "store.py"]
    assert whole.index("open_store") < whole.index("lonely_helper")
    small = repo_map(files, tmp_path, 50)
    assert "open_store" in small and "lonely_helper" not in small
    assert estimate_tokens(small) <= 50 + estimate_tokens("")  # the estimate's own overhead
    # A method comes with its class, never alone, whatever the budget.
    maps = [repo_map(files, tmp_path, budget).splitlines() for budget in range(30, 200, 5)]
    save = "    def save(self, record: dict, *, commit: bool=True) -> int"
    assert any(save in lines for lines in maps)
    assert all("  class Store(Base)" in lines for lines in maps if save in lines)
    assert repo_map([tmp_path / "user_0.py"], tmp_path, 1000) == ""  # no definitions


def test_the_system_prompt_carries_the_map(store: Store, tmp_path: Path) -> None:
    _project(tmp_path)
    chat = Chat(store, tmp_path)
    system = chat.request(4096).messages[0].content
    assert system.endswith(chat.repository_map) and "def open_store(url: str)" in system
