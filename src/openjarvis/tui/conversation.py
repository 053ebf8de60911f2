"""The conversation the model sees, with an honest count of the context tokens it takes.

Counts come from the engine (prompt and completion tokens of each reply); text not yet sent
is estimated from its length, and the total says so until the next reply makes it exact.
"""

from dataclasses import dataclass, field, replace
from typing import Literal, TypeGuard, get_args

from openjarvis.runtime.types import ChatMessage, ChatRequest
from openjarvis.runtime.types import Role as ChatRole
from openjarvis.tui.protocol import TOOL_CLOSE

__all__ = [
    "CHARS_PER_TOKEN_ESTIMATE",
    "ContextCheck",
    "Conversation",
    "Message",
    "Role",
    "estimate_tokens",
    "is_role",
]

Role = Literal["user", "assistant", "tool"]
# Roughly 4 characters a token for English and code; 3 over-counts, so a warning comes early
# rather than a request failing.
CHARS_PER_TOKEN_ESTIMATE = 3
_TOKENS_PER_MESSAGE_ESTIMATE = 6  # the chat template's turn markers


def is_role(value: str) -> TypeGuard[Role]:
    """Whether a stored role is one a conversation holds."""
    return value in get_args(Role)


def estimate_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN_ESTIMATE) + _TOKENS_PER_MESSAGE_ESTIMATE


@dataclass(slots=True)
class Message:
    role: Role
    content: str
    context_tokens: int
    exact: bool  # counted by the engine rather than estimated
    in_context: bool = True
    store_id: int | None = None


@dataclass(frozen=True, slots=True)
class ContextCheck:
    """Whether the next request fits: used tokens plus the reply's budget against the size."""

    used_tokens: int
    reply_tokens: int
    context_tokens: int | None  # None: the model did not say (the check cannot be made)
    droppable_turns: int  # old turns that dropping could free, oldest first
    freed_tokens: int  # what dropping all of them would free

    @property
    def fits(self) -> bool:
        return self.context_tokens is None or self.needed_tokens <= self.context_tokens

    @property
    def needed_tokens(self) -> int:
        return self.used_tokens + self.reply_tokens


@dataclass
class Conversation:
    system: str
    messages: list[Message] = field(default_factory=list)
    system_tokens: int = 0
    system_exact: bool = False
    _changed_since_reply: bool = False  # turns dropped or the model switched: counts are stale

    def __post_init__(self) -> None:
        if not self.system_tokens:
            self.system_tokens = estimate_tokens(self.system)

    @property
    def in_context(self) -> list[Message]:
        return [message for message in self.messages if message.in_context]

    @property
    def used_tokens(self) -> int:
        return self.system_tokens + sum(m.context_tokens for m in self.in_context)

    @property
    def exact(self) -> bool:
        known = self.system_exact and all(m.exact for m in self.in_context)
        return known and not self._changed_since_reply

    def add(self, role: Role, content: str) -> Message:
        """A message not yet sent: its size is an estimate until the engine counts it."""
        message = Message(role, content, estimate_tokens(content), exact=False)
        self.messages.append(message)
        return message

    def add_reply(self, text: str, prompt_tokens: int, completion_tokens: int) -> Message:
        """Record a reply and make every count exact: the prompt's tokens are now known.

        The difference between the engine's count and the counts already known is shared
        among the estimated parts (the new message, the system prompt at first) by size.
        """
        known = sum(m.context_tokens for m in self.in_context if m.exact)
        known += self.system_tokens if self.system_exact else 0
        unknown: list[Message | None] = [m for m in self.in_context if not m.exact]
        if not self.system_exact:
            unknown.append(None)  # None stands for the system prompt
        residual = max(prompt_tokens - known, 0)
        sizes = [self.system_tokens if m is None else m.context_tokens for m in unknown]
        total = sum(sizes) or 1
        left = residual
        for index, (message, size) in enumerate(zip(unknown, sizes, strict=True)):
            share = left if index == len(unknown) - 1 else residual * size // total
            left -= share
            if message is None:
                self.system_tokens, self.system_exact = share, True
            else:
                message.context_tokens, message.exact = share, True
        self._changed_since_reply = False
        reply = Message("assistant", text, completion_tokens, exact=True)
        self.messages.append(reply)
        return reply

    def forget_counts(self) -> None:
        """Another model tokenises differently: every count is an estimate again, and the next
        reply's prompt count is shared among all of them."""
        self.system_exact = False
        for message in self.messages:
            message.exact = False

    def _turns(self) -> list[list[Message]]:
        """In-context messages grouped into turns, each starting at a user message."""
        turns: list[list[Message]] = []
        for message in self.in_context:
            if message.role == "user" or not turns:
                turns.append([])
            turns[-1].append(message)
        return turns

    def check(self, context_tokens: int | None, reply_tokens: int) -> ContextCheck:
        old_turns = self._turns()[:-1]  # the newest turn is the one being sent
        freed = sum(m.context_tokens for turn in old_turns for m in turn)
        return ContextCheck(self.used_tokens, reply_tokens, context_tokens, len(old_turns), freed)

    def drop_oldest_turns(self, context_tokens: int, reply_tokens: int) -> list[Message]:
        """Take the oldest turns out of the context until the request fits (or none is left)."""
        dropped: list[Message] = []
        for turn in self._turns()[:-1]:
            if self.used_tokens + reply_tokens <= context_tokens:
                break
            for message in turn:
                message.in_context = False
                dropped.append(message)
        if dropped:
            self._changed_since_reply = True
        return dropped

    def clear(self) -> None:
        self.messages.clear()
        self._changed_since_reply = False

    def request(self, max_tokens: int, temperature: float = 0.0) -> ChatRequest:
        """The chat request for the model: tool results go as user turns, and neighbours of
        one role are joined, since many chat templates insist that roles alternate."""
        merged: list[ChatMessage] = [ChatMessage("system", self.system)]
        for message in self.in_context:
            role: ChatRole = "assistant" if message.role == "assistant" else "user"
            if merged[-1].role == role and len(merged) > 1:
                merged[-1] = replace(
                    merged[-1], content=f"{merged[-1].content}\n\n{message.content}"
                )
            else:
                merged.append(ChatMessage(role, message.content))
        return ChatRequest(
            messages=tuple(merged),
            max_tokens=max_tokens,
            stop=(TOOL_CLOSE,),
            temperature=temperature,
        )
