"""The assistant's turns with prompt reuse: each reply's footer and stored message say how many
prompt tokens the engine took from its cache and, once a cold prefill has priced a token, the
prefill joules that saved; unknown stays unknown."""

import dataclasses
from pathlib import Path

from openjarvis.power import WindowEnergy
from openjarvis.runtime.types import Completion
from openjarvis.store import Store, assistant_messages
from openjarvis.tui.chat import Chat
from openjarvis.tui.energy import ReplyEnergy
from openjarvis.tui.replies import reply_footer


def _completion(prompt_tokens: int, cached_tokens: int | None) -> Completion:
    return Completion("ok", prompt_tokens, 2, "stop", 1.0, 0.25, 0.5, cached_tokens=cached_tokens)


def _energy(prefill_j: float | None) -> ReplyEnergy:
    window = WindowEnergy("r", 0.0, 1.0, "system", "counter", 9.0, None, None, ())
    return ReplyEnergy.measured(dataclasses.replace(window, prefill_energy_j=prefill_j))


def test_the_footer_shows_cached_tokens_and_the_joules_saved() -> None:
    footer = reply_footer(_completion(1200, 1184), _energy(0.5), prefill_saved_j=23.68)
    assert "1,184/1,200 prompt tokens cached, ≈23.7 J prefill saved" in footer
    assert "cached" not in reply_footer(_completion(1200, None), _energy(0.5))
    unpriced = reply_footer(_completion(1200, 1184), _energy(0.5))
    assert "1,184/1,200 prompt tokens cached" in unpriced and "saved" not in unpriced


def test_a_cold_turn_prices_the_tokens_later_turns_reuse(store: Store, tmp_path: Path) -> None:
    chat = Chat(store, tmp_path)
    chat.add("user", "first", "m")
    assert chat.add_reply("m", _completion(800, 0), "ok", _energy(16.0), False) == 0.0
    chat.add("user", "second", "m")
    saved = chat.add_reply("m", _completion(850, 800), "ok", _energy(1.5), False)
    assert saved == 800 * 16.0 / 800
    assert chat.log.session_id is not None
    replies = [m for m in assistant_messages(store, chat.log.session_id) if m.role == "assistant"]
    stored = [(m.cached_tokens, m.prefill_energy_j, m.prefill_saved_j) for m in replies]
    assert stored == [(0, 16.0, 0.0), (800, 1.5, 16.0)]
