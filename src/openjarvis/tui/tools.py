"""From a parsed tool call to what happens next: a read-only result, or an action to approve.

Reading, listing and searching run at once; edits and shell commands wait for the user.
"""

from dataclasses import dataclass

from openjarvis.tui.edits import EditPlan, plan_edit, plan_write
from openjarvis.tui.protocol import ToolCall
from openjarvis.tui.workspace import ToolRefused, Workspace

__all__ = ["PendingCommand", "PendingEdit", "prepare", "summary"]


@dataclass(frozen=True, slots=True)
class PendingEdit:
    call: ToolCall
    plan: EditPlan
    kind: str = "edit"


@dataclass(frozen=True, slots=True)
class PendingCommand:
    call: ToolCall
    command: str
    kind: str = "run"


def prepare(workspace: Workspace, call: ToolCall) -> str | PendingEdit | PendingCommand:
    """Run a read-only tool, or plan an action that needs approval. Raises ToolRefused."""
    if not call.complete:
        raise ToolRefused("the tool call was cut off before </tool> (the reply hit its limit)")
    if call.name == "read_file":
        return workspace.read_file(call.first_line)
    if call.name == "list_files":
        return workspace.list_files(call.first_line)
    if call.name == "search_files":
        folder = call.rest.split("\n", 1)[0]
        return workspace.search_files(call.first_line, folder)
    if call.name == "edit_file":
        return PendingEdit(call, plan_edit(workspace, call.first_line, call.rest))
    if call.name == "write_file":
        return PendingEdit(call, plan_write(workspace, call.first_line, call.rest))
    command = call.body.strip()
    if not command:
        raise ToolRefused("no command given")
    return PendingCommand(call, command)


def summary(call: ToolCall) -> str:
    """One line naming the call, for the collapsed panel in the chat."""
    argument = call.body.strip().split("\n", 1)[0]
    return f"{call.name} {argument}".strip()
