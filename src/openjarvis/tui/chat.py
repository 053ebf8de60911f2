"""The session's chat: the conversation the model sees (with its context accounting), the
log of it in the database, and the energy totals, always changed together.
"""

from pathlib import Path

from openjarvis.power.reuse import PrefillPrice
from openjarvis.runtime.types import ChatRequest, Completion
from openjarvis.store import Store
from openjarvis.tui.conversation import ContextCheck, Conversation, Message, Role
from openjarvis.tui.energy import ReplyEnergy, SessionEnergy
from openjarvis.tui.protocol import system_prompt
from openjarvis.tui.repomap import REPO_MAP_TOKENS, repo_map
from openjarvis.tui.session import SessionLog
from openjarvis.tui.workspace import Workspace

__all__ = ["REPLY_TOKENS", "Chat"]

REPLY_TOKENS = 1024  # the budget each reply gets, at most a quarter of the context


class Chat:
    def __init__(
        self,
        store: Store,
        working_dir: Path,
        resume_session: str | None = None,
        reply_tokens: int = REPLY_TOKENS,
    ) -> None:
        workspace = Workspace(working_dir)
        self.repository_map = repo_map(workspace.project_files(), workspace.root, REPO_MAP_TOKENS)
        self.conversation = Conversation(system_prompt(str(working_dir), self.repository_map))
        self.log = SessionLog(store, working_dir, resume_session)
        self.energy = SessionEnergy()
        self.prefill_price = PrefillPrice()  # prices the prefill a cached prefix saved
        self._reply_budget = reply_tokens

    def resume(self) -> list[Message]:
        """The stored session's messages, loaded into the conversation and the totals."""
        self.log.load(self.conversation, self.energy)
        return self.conversation.messages

    def reply_tokens(self, context_tokens: int | None) -> int:
        if context_tokens is None:
            return self._reply_budget
        return min(self._reply_budget, context_tokens // 4)

    def check(self, context_tokens: int | None) -> ContextCheck:
        return self.conversation.check(context_tokens, self.reply_tokens(context_tokens))

    def request(self, context_tokens: int | None) -> ChatRequest:
        return self.conversation.request(self.reply_tokens(context_tokens))

    def add(self, role: Role, content: str, model_name: str) -> Message:
        message = self.conversation.add(role, content)
        self.log.record(message, model_name)
        return message

    def add_reply(
        self,
        model_name: str,
        completion: Completion,
        content: str,
        energy: ReplyEnergy,
        cloud: bool,
    ) -> float | None:
        """A finished reply: its counts make the context exact; its energy joins the totals.
        Returns the prefill joules its cached prompt tokens saved (None: unknown)."""
        tokens = completion.completion_tokens
        self.energy.add(model_name, energy, tokens, completion.cost_usd, cloud)
        message = self.conversation.add_reply(
            content, completion.prompt_tokens, completion.completion_tokens
        )
        cached = completion.cached_tokens
        self.prefill_price.observe(completion.prompt_tokens, cached, energy.prefill_j)
        saved_j = self.prefill_price.saved_j(cached)
        self.log.record(message, model_name, energy, completion, saved_j)
        return saved_j

    def add_unkept_reply(self, model_name: str, energy: ReplyEnergy, cloud: bool) -> None:
        """A stopped or failed reply: not in the context, but its joules were spent."""
        self.energy.add(model_name, energy, 0, None, cloud)

    def drop_to_fit(self, context_tokens: int) -> tuple[list[Message], bool]:
        """Take the oldest turns out of the context until the request fits; says whether it
        does now."""
        dropped = self.conversation.drop_oldest_turns(
            context_tokens, self.reply_tokens(context_tokens)
        )
        self.log.dropped(dropped)
        return dropped, self.check(context_tokens).fits

    def withdraw_newest(self) -> None:
        """The newest message was not sent: it stays in the history, outside the context."""
        newest = self.conversation.in_context[-1]
        newest.in_context = False
        self.log.dropped([newest])

    def clear(self) -> None:
        """`/clear`: a new conversation and totals; the old session stays stored."""
        self.conversation.clear()
        self.energy.clear()
        self.log.new_session()
