"""Keeping the conversation in the database: every message as it happens, and `--resume`.

The session row is created with the first message, so opening and quitting leaves nothing.
"""

from pathlib import Path

from openjarvis.errors import UserError
from openjarvis.runtime.types import Completion
from openjarvis.store import (
    AssistantMessageRecord,
    Store,
    add_assistant_message,
    assistant_messages,
    create_assistant_session,
    latest_assistant_session,
    set_out_of_context,
)
from openjarvis.tui.conversation import Conversation, Message, is_role
from openjarvis.tui.energy import ReplyEnergy, SessionEnergy

__all__ = ["SessionLog", "latest_session_id"]


def latest_session_id(store: Store, working_dir: Path) -> str:
    """The last session in this folder, for `jarvis --resume`."""
    found = latest_assistant_session(store, str(working_dir))
    if found is None:
        raise UserError(
            f"no earlier jarvis session in {working_dir} (in {store.url}); "
            "start one with `jarvis` (without --resume)"
        )
    return found.id


class SessionLog:
    def __init__(self, store: Store, working_dir: Path, session_id: str | None = None) -> None:
        self._store = store
        self._working_dir = working_dir
        self.session_id = session_id

    def new_session(self) -> None:
        """`/clear`: later messages go to a new session; the old one stays stored."""
        self.session_id = None

    def record(
        self,
        message: Message,
        model_name: str,
        energy: ReplyEnergy | None = None,
        completion: Completion | None = None,
        prefill_saved_j: float | None = None,
    ) -> None:
        if self.session_id is None:
            self.session_id = create_assistant_session(
                self._store, str(self._working_dir), model_name
            )
        is_reply = message.role == "assistant"
        record = AssistantMessageRecord(
            role=message.role,
            content=message.content,
            context_tokens=message.context_tokens,
            context_tokens_exact=message.exact,
            model_name=model_name if is_reply else None,
            prompt_tokens=completion.prompt_tokens if completion else None,
            completion_tokens=message.context_tokens if is_reply else None,
            energy_j=energy.energy_j if energy else None,
            energy_method=energy.method if energy else None,
            energy_null_reason=energy.null_reason if energy else None,
            cost_usd=completion.cost_usd if completion else None,
            cached_tokens=completion.cached_tokens if completion else None,
            prefill_energy_j=energy.prefill_j if energy else None,
            prefill_saved_j=prefill_saved_j,
            in_context=message.in_context,
        )
        message.store_id = add_assistant_message(self._store, self.session_id, record)

    def dropped(self, messages: list[Message]) -> None:
        ids = [m.store_id for m in messages if m.store_id is not None]
        if self.session_id is not None:
            set_out_of_context(self._store, self.session_id, ids)

    def load(self, conversation: Conversation, energy: SessionEnergy) -> None:
        """Fill a new conversation and the energy totals from the stored session.

        Stored counts came from another run, and maybe another model: they stay estimates.
        """
        if self.session_id is None:
            return
        for stored in assistant_messages(self._store, self.session_id):
            role = stored.role
            assert is_role(role), role
            message = Message(
                role, stored.content, stored.context_tokens, False, stored.in_context, stored.id
            )
            conversation.messages.append(message)
            if role == "assistant" and stored.model_name is not None:
                reply_energy = ReplyEnergy(
                    stored.energy_j, stored.energy_method, stored.energy_null_reason
                )
                tokens = stored.completion_tokens or 0
                # A stored reply says whether it ran here only when it was priced (cloud).
                cloud = True if stored.cost_usd is not None else None
                energy.add(stored.model_name, reply_energy, tokens, stored.cost_usd, cloud)
        conversation.forget_counts()
