"""Running the model's tool calls: read-only ones at once, edits and commands once approved.

A turn allows a few calls (small models can loop); each outcome says what the chat shows and
what goes back to the model. `prepare` and `run_command` are slow: call them from a worker.
"""

from dataclasses import dataclass

from openjarvis.tui.edits import UndoStack, apply_edit
from openjarvis.tui.protocol import ToolCall, format_result
from openjarvis.tui.shell import run_command
from openjarvis.tui.tools import PendingCommand, PendingEdit, prepare, summary
from openjarvis.tui.workspace import ToolRefused, Workspace

__all__ = ["MAX_TOOL_ROUNDS", "ToolOutcome", "ToolRunner"]

# Small models can loop on a tool; after this many calls in one turn the user decides.
MAX_TOOL_ROUNDS = 8


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    call: ToolCall
    title: str  # one line for the collapsed panel
    shown: str  # the panel's body
    result: str  # what goes back to the model (format_result wraps it)

    @property
    def for_model(self) -> str:
        return format_result(self.call, self.result)


class ToolRunner:
    def __init__(self, workspace: Workspace, shell_timeout_s: float) -> None:
        self.workspace = workspace
        self.undo_stack = UndoStack(workspace)
        self.shell_timeout_s = shell_timeout_s
        self.always: set[str] = set()  # "edit", "run": approved for the rest of the session
        self.rounds = 0  # calls in the current turn
        # The calls of the current turn, by name and body, with the round each came in: a
        # small model can repeat one call (the system prompt's example) turn after turn.
        self.made: dict[tuple[str, str], int] = {}

    def new_turn(self) -> None:
        self.rounds = 0
        self.made.clear()

    def next_round(self) -> bool:
        """Count a call; False once the turn has had MAX_TOOL_ROUNDS."""
        self.rounds += 1
        return self.rounds <= MAX_TOOL_ROUNDS

    def prepare(self, call: ToolCall) -> ToolOutcome | PendingEdit | PendingCommand:
        """Read, list or search (slow in a large tree), or plan the edit or command; a call
        identical to one made earlier in the turn is not made again, and the model is told."""
        key = (call.name, call.body.strip())
        if (first := self.made.get(key)) is not None:
            told = (
                f"not run: this is the same call as call {first} of this turn, whose result is "
                "above; use it, make a different call, or answer the user"
            )
            return ToolOutcome(call, f"{summary(call)} · repeated, not run again", told, told)
        self.made[key] = self.rounds
        try:
            outcome = prepare(self.workspace, call)
        except ToolRefused as refusal:
            refused = f"refused: {refusal}"
            return ToolOutcome(call, f"{summary(call)} · refused", refused, refused)
        if isinstance(outcome, str):
            lines = len(outcome.splitlines())  # a file ending in a newline has no extra line
            return ToolOutcome(call, f"{summary(call)} · {lines} lines", outcome, outcome)
        return outcome

    def approved_already(self, pending: PendingEdit | PendingCommand) -> bool:
        return pending.kind in self.always

    def approve_always(self, pending: PendingEdit | PendingCommand) -> None:
        self.always.add(pending.kind)

    def decline(self, pending: PendingEdit | PendingCommand) -> ToolOutcome:
        what = "edit" if isinstance(pending, PendingEdit) else "command"
        return ToolOutcome(
            pending.call,
            f"{summary(pending.call)} · declined",
            "",
            f"the user declined this {what}; ask them what to do instead",
        )

    def apply(self, pending: PendingEdit) -> ToolOutcome:
        title = f"{summary(pending.call)} · applied"
        try:
            self.undo_stack.push(apply_edit(self.workspace, pending.plan))
            result = f"applied to {pending.plan.relative}"
        except ToolRefused as refusal:
            title, result = f"{summary(pending.call)} · not applied", f"refused: {refusal}"
        return ToolOutcome(pending.call, title, pending.plan.diff, result)

    def run_command(self, pending: PendingCommand) -> ToolOutcome:
        result = run_command(pending.command, self.workspace.root, self.shell_timeout_s)
        status = "timed out" if result.exit_code is None else f"exit {result.exit_code}"
        output = result.for_model()
        return ToolOutcome(pending.call, f"$ {pending.command} · {status}", output, output)
