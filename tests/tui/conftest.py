"""Fixtures for the assistant's tests: a project folder, a database, the real meter, the app.

Only the model is scripted (tests/tui/scripted.py); files, git, shell, store and meter are real.
"""

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from openjarvis.power import Meter
from openjarvis.store import Store, open_store
from openjarvis.tui import AssistantApp
from openjarvis.tui.energy import AssistantMeter
from tests.tui.scripted import ScriptedEngine, scripted_model

__all__ = ["make_app", "meter", "project", "store"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "hello.py").write_text('print("hello")\n')
    return folder


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(str(tmp_path / "jarvis.db")) as opened:
        yield opened


@pytest.fixture(scope="session")
def meter() -> Iterator[Meter]:
    with Meter.discover(scope="system") as started:
        yield started


@pytest.fixture
def make_app(project: Path, store: Store, meter: Meter) -> Callable[..., AssistantApp]:
    """An app over scripted engines: `engines` maps a /model spec (None: the first) to one;
    the real meter unless the test gives another."""

    def make(
        *engines: ScriptedEngine,
        context_tokens: int | None = 4096,
        resume_session: str | None = None,
        meter: AssistantMeter = meter,
    ) -> AssistantApp:
        by_spec: dict[str | None, ScriptedEngine] = {
            None: engines[0],
            **{engine.name: engine for engine in engines},
        }
        return AssistantApp(
            opener=lambda spec: scripted_model(by_spec[spec], context_tokens),
            model_spec=None,
            meter=meter,
            store=store,
            working_dir=project,
            resume_session=resume_session,
            shell_timeout_s=10.0,
        )

    return make
