"""`jarvis serve`: an OpenAI-compatible server over a model, with the energy of every reply.

Binds 127.0.0.1 unless --host says otherwise; requests are logged to the store unless --no-log.
"""

import time
from typing import Annotated

import typer
from rich.console import Console

from openjarvis.errors import UserError
from openjarvis.serve.admission import DEFAULT_MAX_CONCURRENCY, DEFAULT_MAX_QUEUE, check_limits

__all__ = ["serve_command"]

API_KEY_ENV = "OPENJARVIS_API_KEY"


def serve_command(
    model: Annotated[
        str | None,
        typer.Option(help="GGUF path or `jarvis models` name; a cloud engine's model name"),
    ] = None,
    engine: Annotated[str, typer.Option(help="llamacpp, torch, openai or anthropic")] = "llamacpp",
    base_url: Annotated[str | None, typer.Option(help="Cloud engine's API base URL")] = None,
    api_key_env: Annotated[
        str | None, typer.Option(help="Variable holding the cloud engine's API key")
    ] = None,
    host: Annotated[str, typer.Option(help="Address to bind (0.0.0.0: every interface)")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="Port to listen on")] = 8000,
    api_key: Annotated[
        str | None,
        typer.Option(envvar=API_KEY_ENV, help=f"Key clients must send (or {API_KEY_ENV})"),
    ] = None,
    n_ctx: Annotated[int, typer.Option(help="Context size in tokens (0: the model's)")] = 4096,
    threads: Annotated[int | None, typer.Option(help="CPU threads (default: cores)")] = None,
    n_gpu_layers: Annotated[int, typer.Option(help="llamacpp: layers on the GPU (-1: all)")] = 0,
    tp: Annotated[int, typer.Option(help="torch engine: tensor-parallel GPUs")] = 1,
    scope: Annotated[str, typer.Option(help="Energy scope: system or accelerator")] = "system",
    idle_seconds: Annotated[float, typer.Option(help="Idle power measured at start")] = 3.0,
    db: Annotated[str | None, typer.Option(help="Database URL or path (or OPENJARVIS_DB)")] = None,
    no_log: Annotated[bool, typer.Option("--no-log", help="Do not log requests")] = False,
    max_concurrency: Annotated[
        int,
        typer.Option(help="Requests generating at once, at most (the engine may allow fewer)"),
    ] = DEFAULT_MAX_CONCURRENCY,
    max_queue: Annotated[
        int, typer.Option(help="Requests waiting for a turn; beyond them the answer is 429")
    ] = DEFAULT_MAX_QUEUE,
) -> None:
    """Serve a model over the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models)."""
    from openjarvis.report.runs import coverage_names, scope_label
    from openjarvis.runtime.cloud import measured_here
    from openjarvis.runtime.engines import EngineSpec, open_engine, resolve_engine_model
    from openjarvis.runtime.model_kind import base_model_note, read_model_kind
    from openjarvis.serve import running_server
    from openjarvis.store import open_store

    if scope not in ("system", "accelerator"):
        raise UserError(f"unknown energy scope {scope!r}; use --scope system or accelerator")
    check_limits(max_concurrency, max_queue)
    spec = EngineSpec(
        kind=engine,
        model=model,
        base_url=base_url,
        api_key_env=api_key_env,
        n_ctx=n_ctx,
        threads=threads,
        n_gpu_layers=n_gpu_layers,
        tp=tp,
        concurrency=max_concurrency,  # the torch engine sizes its KV cache and graphs by it
    )
    resolved = resolve_engine_model(spec)
    store = None if no_log else open_store(db)
    console = Console(stderr=True)
    try:
        opened = open_engine(spec, resolved)
        try:
            with running_server(
                opened,
                store,
                host=host,
                port=port,
                api_key=api_key,
                scope=scope,  # type: ignore[arg-type]  # typer passes str; checked above
                idle_seconds=idle_seconds,
                max_concurrency=max_concurrency,
                max_queue=max_queue,
            ) as server:
                method = server.meter.method if measured_here(opened) else "estimate"
                console.print(f"serving {opened.model_name} at {server.url}")
                console.print(
                    f"[dim]{server.admission.slots} request(s) at once (engine {opened.kind}: "
                    f"{opened.concurrency}, --max-concurrency {max_concurrency}), "
                    f"{max_queue} more may wait (--max-queue)[/]"
                )
                for name, holder in server.shared_with.items():
                    console.print(
                        f"note: another measurement holds {name} ({holder}): replies' energy "
                        "includes its draw",
                        style="yellow",
                        markup=False,
                        soft_wrap=True,
                    )
                kind = read_model_kind(resolved.path) if resolved is not None else None
                if note := base_model_note(opened.model_name, kind):
                    console.print(note, style="yellow", markup=False, soft_wrap=True)
                coverage = server.meter.coverage.to_dict()
                console.print(
                    f"energy: {method or 'none'} · {scope_label(scope, coverage)}; Ctrl-C stops"
                )
                if out_of_scope := coverage_names(coverage, "out_of_scope"):
                    console.print(
                        f"[dim]out of scope (the engine does not use them): "
                        f"{', '.join(out_of_scope)}[/]"
                    )
                if host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
                    console.print(f"[yellow]open to the network without a key: set {API_KEY_ENV}")
                if store is not None:
                    console.print(f"[dim]requests are logged to {store.url} (--no-log: off)[/]")
                while True:
                    time.sleep(3600)
        finally:
            opened.close()
    except KeyboardInterrupt:
        console.print("stopped")
    finally:
        if store is not None:
            store.close()
