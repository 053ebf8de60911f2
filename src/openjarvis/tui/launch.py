"""Opening `jarvis` in a folder: the database, the energy meter, the app; closing them after.

The model loads inside the app (in a worker), so the window opens at once.
"""

from pathlib import Path

from openjarvis.power import Meter
from openjarvis.store import open_store
from openjarvis.tui.app import AssistantApp
from openjarvis.tui.engines import open_model
from openjarvis.tui.session import latest_session_id

__all__ = ["run_assistant"]


def run_assistant(
    model: str | None, resume: bool, db: str | None, working_dir: Path | None = None
) -> None:
    folder = (working_dir or Path.cwd()).resolve()
    with open_store(db) as store:
        resume_session = latest_session_id(store, folder) if resume else None
        # System scope: on a laptop the CPU and DRAM do the work, not only a GPU. The meter
        # reads the engine's GPUs, and every engine `open_model` opens runs on none (llama.cpp
        # with no layer offloaded keeps off the GPU; cloud models compute elsewhere).
        with Meter.discover(scope="system", gpus=()) as meter:
            app = AssistantApp(
                opener=open_model,
                model_spec=model,
                meter=meter,
                store=store,
                working_dir=folder,
                resume_session=resume_session,
            )
            try:
                app.run()
            finally:
                if app.model is not None:
                    app.model.engine.close()
