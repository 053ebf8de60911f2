"""File edits the model proposes: search/replace blocks or whole files, their diffs, and undo.

Nothing is written until the user approves; each applied edit keeps the old text for `/undo`.
"""

import difflib
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from openjarvis.tui.workspace import ToolRefused, Workspace

__all__ = ["AppliedEdit", "EditPlan", "UndoStack", "apply_edit", "plan_edit", "plan_write"]

_BLOCK = re.compile(
    r"^<{5,9} ?SEARCH[^\n]*\n(.*?)^={5,9}[^\n]*\n(.*?)^>{5,9} ?REPLACE[^\n]*$",
    re.DOTALL | re.MULTILINE,
)


@dataclass(frozen=True, slots=True)
class EditPlan:
    """A proposed change to one file; `before` is None when the file does not exist yet."""

    path: Path
    relative: str
    before: str | None
    after: str

    @property
    def diff(self) -> str:
        lines = difflib.unified_diff(
            (self.before or "").splitlines(keepends=True),
            self.after.splitlines(keepends=True),
            fromfile="/dev/null" if self.before is None else f"a/{self.relative}",
            tofile=f"b/{self.relative}",
        )
        return "".join(line if line.endswith("\n") else f"{line}\n" for line in lines)


@dataclass(frozen=True, slots=True)
class AppliedEdit:
    plan: EditPlan
    git_commit: str | None  # the last commit that touched the file when the edit was made


def _blocks(text: str) -> list[tuple[str, str]]:
    return [(search, replace) for search, replace in _BLOCK.findall(text)]


def plan_edit(workspace: Workspace, path_text: str, blocks_text: str) -> EditPlan:
    """Apply SEARCH/REPLACE blocks in memory; each SEARCH must occur exactly once."""
    path = workspace.resolve(path_text)
    relative = workspace.relative(path)
    if not path.is_file():
        raise ToolRefused(f"{relative} does not exist; create it with write_file")
    blocks = _blocks(blocks_text)
    if not blocks:
        raise ToolRefused(
            "no SEARCH/REPLACE block found; write <<<<<<< SEARCH, the old lines, =======, "
            "the new lines, >>>>>>> REPLACE (or use write_file)"
        )
    before = path.read_text(encoding="utf-8")
    after = before
    for search, replace in blocks:
        count = after.count(search) if search else 0
        if count != 1:
            where = "does not occur" if count == 0 else f"occurs {count} times"
            raise ToolRefused(
                f"the SEARCH text {where} in {relative}; copy the lines exactly "
                "(with enough of them to be unique) or use write_file"
            )
        after = after.replace(search, replace, 1)
    return EditPlan(path, relative, before, after)


def plan_write(workspace: Workspace, path_text: str, content: str) -> EditPlan:
    """A whole-file write: the form small models manage when diffs are beyond them."""
    path = workspace.resolve(path_text)
    if path.is_dir():
        raise ToolRefused(f"{workspace.relative(path)} is a folder")
    before = path.read_text(encoding="utf-8") if path.exists() else None
    after = content if content.endswith("\n") or not content else f"{content}\n"
    return EditPlan(path, workspace.relative(path), before, after)


def _git(root: Path, *args: str) -> str | None:
    """A git command's output, or None when the folder is not a repository (or git is absent)."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _last_commit(root: Path, relative: str) -> str | None:
    return _git(root, "log", "-1", "--format=%h", "--", relative) or None


def apply_edit(workspace: Workspace, plan: EditPlan) -> AppliedEdit:
    """Write the plan; refuses if the file changed since the plan was shown."""
    current = plan.path.read_text(encoding="utf-8") if plan.path.exists() else None
    if current != plan.before:
        raise ToolRefused(f"{plan.relative} changed since the diff was shown; not applied")
    plan.path.parent.mkdir(parents=True, exist_ok=True)
    plan.path.write_text(plan.after, encoding="utf-8")
    return AppliedEdit(plan, _last_commit(workspace.root, plan.relative))


class UndoStack:
    """The edits applied in this session, newest last; `undo` reverts the newest one."""

    def __init__(self, workspace: Workspace) -> None:
        self._workspace = workspace
        self._applied: list[AppliedEdit] = []

    def __len__(self) -> int:
        return len(self._applied)

    def push(self, edit: AppliedEdit) -> None:
        self._applied.append(edit)

    def undo(self) -> str:
        """Revert the newest edit and say what happened (and what git now shows)."""
        if not self._applied:
            return "nothing to undo: no edit was applied in this session"
        edit = self._applied[-1]
        plan, root = edit.plan, self._workspace.root
        current = plan.path.read_text(encoding="utf-8") if plan.path.exists() else None
        if current != plan.after:
            return (
                f"not undone: {plan.relative} changed after the edit; undoing would lose "
                "those changes (revert it by hand or with git)"
            )
        self._applied.pop()
        if plan.before is None:
            plan.path.unlink()
        else:
            plan.path.write_text(plan.before, encoding="utf-8")
        message = f"undone: {plan.relative} is back to how it was before the edit"
        if _git(root, "rev-parse", "--is-inside-work-tree") != "true":
            return message
        commit = _last_commit(root, plan.relative)
        if commit is not None and commit != edit.git_commit:
            # The edit was committed meanwhile: the restored file is now a change to commit.
            message += f"; the edit was committed in {commit}, so commit this revert too"
        status = _git(root, "status", "--short", "--", plan.relative)
        return f"{message} (git: {status or 'unchanged from HEAD'})"
