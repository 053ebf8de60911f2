"""`jarvis`, the energy-aware coding assistant for the terminal (Textual).

`run_assistant` opens it in a folder; `AssistantApp` is the app itself (tests drive it).
"""

from openjarvis.tui.app import AssistantApp
from openjarvis.tui.launch import run_assistant

__all__ = ["AssistantApp", "run_assistant"]
