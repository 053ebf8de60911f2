"""A map of the repository for the model's context: the definitions of each file (classes,
functions, methods, with their signatures), the most used first, cut to a token budget.

Python is read with `ast`; JavaScript, TypeScript, Go and Rust with tree-sitter's grammars when
they are installed (`pip install 'openjarvis[map]'`), else those files are left out. A name's
use is how many other files mention it, as aider ranks its map by references.
"""

import ast
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from openjarvis.tui.conversation import CHARS_PER_TOKEN_ESTIMATE

__all__ = ["REPO_MAP_TOKENS", "Definition", "file_definitions", "repo_map"]

REPO_MAP_TOKENS = 1024  # aider's default map size; the map sits in the system prompt
MAX_FILE_BYTES = 500_000  # larger files are generated or data, not code to map
MAX_FILES = 5_000
_SIGNATURE_CHARS = 120
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
HEADER = "Repository map (definitions, the most used first; read_file shows the code):"


@dataclass(frozen=True, slots=True)
class Definition:
    path: str  # relative to the project
    line: int
    depth: int  # 0: top level; 1: inside a class, impl or interface
    name: str
    signature: str  # one line, without the body
    parent_line: int | None = None  # the line of the class (impl, interface) it is inside


def file_definitions(path: str, text: str) -> list[Definition] | None:
    """The definitions in one file, in order; None for a language this map cannot read."""
    if path.endswith(".py"):
        return _python(path, text)
    language = _EXTENSIONS.get(Path(path).suffix)
    if language is None:
        return None
    parser = _parser(language)
    if parser is None:
        return None
    tree = parser.parse(text.encode("utf-8"))
    return list(_tree_definitions(path, tree.root_node, 0))


def repo_map(files: list[Path], root: Path, budget_tokens: int) -> str:
    """The map of `files` (under `root`), at most `budget_tokens` by the context's estimate;
    empty when no file has a definition it can read."""
    definitions: list[Definition] = []
    mentions: dict[str, int] = {}  # identifier -> files that mention it
    defined: dict[str, int] = {}  # name -> definitions of it
    for path in files[:MAX_FILES]:
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                continue
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # unreadable or binary: nothing to map
        for name in set(_IDENTIFIER.findall(text)):
            mentions[name] = mentions.get(name, 0) + 1
        found = file_definitions(path.relative_to(root).as_posix(), text) or []
        for definition in found:
            defined[definition.name] = defined.get(definition.name, 0) + 1
        definitions += found

    parents = {(d.path, d.line): d for d in definitions if d.depth == 0}

    def used(definition: Definition) -> float:
        """Files that mention the name beyond those defining it, shared among its
        definitions (a `read` defined in ten files is no one's in particular); a method
        never ranks above its class."""
        name = definition.name
        if name.startswith("__") and name.endswith("__"):
            return 0.0
        own = max(mentions.get(name, 0) - defined[name], 0) / defined[name]
        parent = parents.get((definition.path, definition.parent_line or 0))
        return own if parent is None else min(own, used(parent))

    ranked = sorted(definitions, key=lambda d: (-used(d), d.depth, d.path, d.line))
    budget_chars = budget_tokens * CHARS_PER_TOKEN_ESTIMATE - len(HEADER) - 1
    chosen: set[Definition] = set()
    spent = 0
    for definition in ranked:
        # A method is shown under its class: the class comes with it.
        parent = parents.get((definition.path, definition.parent_line or 0))
        adding = [d for d in (parent, definition) if d is not None and d not in chosen]
        cost = sum(len(_line(d)) + 1 for d in adding)
        if all(d.path != definition.path for d in chosen):
            cost += len(definition.path) + 1
        if adding and spent + cost <= budget_chars:  # else a shorter one may still fit
            chosen.update(adding)
            spent += cost
    if not chosen:
        return ""
    rank_of_file: dict[str, int] = {}
    for position, definition in enumerate(ranked):
        if definition in chosen:
            rank_of_file.setdefault(definition.path, position)
    lines = [HEADER]
    for shown in sorted(rank_of_file, key=rank_of_file.__getitem__):
        lines.append(shown)
        in_file = sorted((d for d in chosen if d.path == shown), key=lambda d: d.line)
        lines += [_line(d) for d in in_file]
    return "\n".join(lines)


def _line(definition: Definition) -> str:
    return "  " * (definition.depth + 1) + definition.signature


# ---- Python ----------------------------------------------------------------------------------


def _python(path: str, text: str) -> list[Definition]:
    try:
        module = ast.parse(text)
    except (SyntaxError, ValueError):
        return []  # not valid Python (yet): nothing to map
    found: list[Definition] = []
    for node in module.body:
        found += _python_node(path, node, 0)
    return found


def _python_node(
    path: str, node: ast.stmt, depth: int, parent_line: int | None = None
) -> list[Definition]:
    if isinstance(node, ast.ClassDef):
        bases = ", ".join(ast.unparse(base) for base in node.bases)
        signature = f"class {node.name}({bases})" if bases else f"class {node.name}"
        found = [Definition(path, node.lineno, depth, node.name, signature)]
        if depth == 0:
            for child in node.body:
                found += _python_node(path, child, depth + 1, node.lineno)
        return found
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        keyword = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
        signature = f"{keyword} {node.name}({ast.unparse(node.args)})"
        if node.returns is not None:
            signature += f" -> {ast.unparse(node.returns)}"
        return [Definition(path, node.lineno, depth, node.name, _cut(signature), parent_line)]
    return []


def _cut(signature: str) -> str:
    signature = " ".join(signature.split())
    if len(signature) > _SIGNATURE_CHARS:
        return signature[: _SIGNATURE_CHARS - 1] + "…"
    return signature


# ---- tree-sitter languages -------------------------------------------------------------------

_EXTENSIONS = {
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "javascript",
    ".ts": "typescript",
    ".tsx": "tsx",
    ".go": "go",
    ".rs": "rust",
}
# Node types that define a name, and those among them whose body holds further definitions.
_DEFINING = {
    "function_declaration",
    "generator_function_declaration",
    "class_declaration",
    "method_definition",
    "interface_declaration",
    "type_alias_declaration",
    "method_declaration",  # Go
    "type_spec",  # Go
    "function_item",  # Rust
    "struct_item",
    "enum_item",
    "trait_item",
    "impl_item",
}
_CONTAINERS = {"class_declaration", "interface_declaration", "trait_item", "impl_item"}
_FUNCTION_VALUES = {"arrow_function", "function_expression", "function"}
# Nodes around definitions (exports, declarations, bodies of classes, impls and interfaces):
# looked into; everything else (function bodies, calls) is not.
_WRAPPERS = {
    "export_statement",
    "lexical_declaration",
    "variable_declaration",
    "class_body",
    "interface_body",
    "object_type",
    "type_declaration",  # Go
    "declaration_list",  # Rust
}


def _tree_definitions(
    path: str, node: Any, depth: int, parent_line: int | None = None
) -> Iterator[Definition]:
    for child in node.named_children:
        kind = child.type
        if kind == "variable_declarator" and depth == 0:
            value = child.child_by_field_name("value")
            if value is not None and value.type in _FUNCTION_VALUES:
                yield _tree_definition(path, child, depth, parent_line)
            continue
        if kind in _DEFINING:
            definition = _tree_definition(path, child, depth, parent_line)
            yield definition
            if kind in _CONTAINERS and depth == 0:
                yield from _tree_definitions(path, child, depth + 1, definition.line)
        elif kind in _WRAPPERS:
            yield from _tree_definitions(path, child, depth, parent_line)


def _tree_definition(path: str, node: Any, depth: int, parent_line: int | None) -> Definition:
    name_node = node.child_by_field_name("name") or node.child_by_field_name("type")
    name = name_node.text.decode("utf-8", "replace") if name_node is not None else "?"
    text = node.text.decode("utf-8", "replace")
    head = text.split("{", 1)[0].split("\n", 1)[0]
    line = node.start_point[0] + 1
    return Definition(path, line, depth, name, _cut(head.strip()), parent_line)


@cache
def _parser(language: str) -> Any:
    """tree-sitter's parser for `language`, or None when its wheels are not installed."""
    loaders: dict[str, Callable[[], Any]] = {
        "javascript": lambda: __import__("tree_sitter_javascript").language(),
        "typescript": lambda: __import__("tree_sitter_typescript").language_typescript(),
        "tsx": lambda: __import__("tree_sitter_typescript").language_tsx(),
        "go": lambda: __import__("tree_sitter_go").language(),
        "rust": lambda: __import__("tree_sitter_rust").language(),
    }
    try:
        from tree_sitter import Language, Parser

        return Parser(Language(loaders[language]()))
    except ImportError:
        return None
