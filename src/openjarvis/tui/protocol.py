"""The plain-text tool protocol: how the model asks for a tool, and how the answer goes back.

A call is `<tool NAME>` + body + `</tool>`; the closing tag is a stop sequence, so a reply
ends at its first call and the model cannot invent the tool's output (docs/assistant.md).
"""

import re
from dataclasses import dataclass

__all__ = [
    "TOOL_CLOSE",
    "TOOL_NAMES",
    "ToolCall",
    "format_result",
    "parse_reply",
    "system_prompt",
]

TOOL_CLOSE = "</tool>"
TOOL_NAMES = ("read_file", "list_files", "search_files", "edit_file", "write_file", "run")
# Only the known names open a call: small models echo the prompt's "<tool NAME>" as prose.
_OPEN = re.compile(rf"<tool\s+({'|'.join(TOOL_NAMES)})\s*>")


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    body: str  # what stood between the tags, without the newline after the opening tag
    complete: bool  # False when the reply ran out of tokens before the closing tag

    @property
    def first_line(self) -> str:
        return self.body.split("\n", 1)[0].strip()

    @property
    def rest(self) -> str:
        """The body after its first line (the text of a write_file, the blocks of an edit)."""
        return self.body.split("\n", 1)[1] if "\n" in self.body else ""


def parse_reply(text: str, stopped_at_close: bool) -> tuple[str, ToolCall | None]:
    """Split a reply into its prose and its tool call (the first one; a reply holds one).

    `stopped_at_close`: the engine stopped on TOOL_CLOSE, so an open tag's body is whole.
    """
    match = _OPEN.search(text)
    if match is None:
        return text, None
    body = text[match.end() :]
    close = body.find(TOOL_CLOSE)
    complete = stopped_at_close or close >= 0
    if close >= 0:
        body = body[:close]
    body = body.removeprefix("\n").removesuffix("\n")
    return text[: match.start()].rstrip(), ToolCall(match.group(1), body, complete)


def format_result(call: ToolCall, result: str) -> str:
    """The user-turn text that hands a tool's result back to the model."""
    return f'<result tool="{call.name}">\n{result}\n</result>'


def system_prompt(working_dir: str, repository_map: str = "") -> str:
    """Short on purpose: a small model pays for every prompt token, and tends to echo a long
    prompt back. One example call, then each tool's arguments in a line; then the repository
    map, if any (it stays the same all session, so an engine that reuses a prompt's prefix
    computes it once)."""
    tail = f"\n\n{repository_map}" if repository_map else ""
    return f"""You are Jarvis, a coding assistant in the folder {working_dir}.
Answer the user's question directly, in Markdown. When you need a file or a command, write one
tool call and stop after it; its result comes back in the next message. A call looks like this:
<tool read_file>
src/app.py
</tool>
Tools and their lines: read_file (a path); list_files (a folder, or nothing); search_files
(text to find, then an optional folder); edit_file (a path, then blocks of
<<<<<<< SEARCH, the exact old lines, =======, the new lines, >>>>>>> REPLACE); write_file (a
path, then the whole new file); run (a shell command). Paths are relative to the folder.
The user approves every edit and command.{tail}"""
