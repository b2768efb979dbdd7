"""``authio serve``: run the engine, the control plane, or both in one process."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from common.settings import Settings

# OTEL_SERVICE_NAME overrides these; `authio serve` hosts both apps in one process: "authio".
SERVICE_NAMES: Final = {"all": "authio", "engine": "authio-engine",
                        "control-plane": "authio-control-plane"}


def build_app(settings: Settings, target: str) -> tuple[web.Application, int]:
    """The app ``target`` names (``all``, ``engine``, ``control-plane``) and its port. The apps
    are imported here, not with this module, and only those ``target`` needs: an engine does
    not load the control plane's packages, and a supervisor of engine workers serves no app
    (``engine.workers``)."""
    from engine.app import create_engine_app, setup_engine

    if target == "engine":  # without the control plane's packages: 40 MB less per engine
        return create_engine_app(settings), settings.engine_port
    from common.runtime import base_app
    from control_plane.app import create_control_plane_app, setup_control_plane

    if target == "control-plane":
        return create_control_plane_app(settings), settings.port
    app = base_app(settings)
    setup_engine(app)
    setup_control_plane(app)
    return app, settings.port


def serve(settings: Settings, target: str, workers: int | None = None) -> None:
    """Serve ``target`` on uvloop until SIGTERM or SIGINT, which stop it gracefully: stop
    accepting, finish in-flight requests (up to 15 s), then run every cleanup context.

    ``engine`` runs ``workers`` processes (``--workers``; else ``SERVICE_ENGINE_WORKERS``, else
    one per core) sharing its port under a supervisor (``engine.workers``); one worker is this
    process alone, as before. With ``SERVICE_TLS_CERT_FILE`` and ``SERVICE_TLS_KEY_FILE`` every
    listener serves HTTPS and SIGHUP reloads them (``common.tls``). Raises ValueError for a
    count below 1."""
    if target == "engine":
        from engine.workers import supervise, worker_count

        count = worker_count(settings, workers)
        if count > 1:
            code = supervise(settings, count)
            if code:
                raise SystemExit(code)
            return
    import uvloop

    from common.runtime import run_app
    from common.telemetry import setup_metrics, setup_tracing, shutdown_metrics, shutdown_tracing
    from common.tls import server_tls

    # Before any app, pool or client session exists: instrumentation patches their classes and
    # base_app puts the server-span middleware first.
    provider = setup_tracing(settings, service_name_default=SERVICE_NAMES[target])
    meters = setup_metrics(settings, service_name_default=SERVICE_NAMES[target])
    try:
        app, port = build_app(settings, target)
        tls = server_tls(settings.tls_cert_file, settings.tls_key_file,
                         settings.tls_key_password_file)
        scheme = "https" if tls is not None else "http"
        run_app(
            app, host=settings.host, port=port, loop=uvloop.new_event_loop(),
            shutdown_timeout=15.0, tls=tls,
            on_listening=lambda: print(f"authio {target} listening on {scheme}://{settings.host}:"
                                       f"{port}", flush=True),
        )
    finally:
        if provider is not None:
            shutdown_tracing(provider)  # flush the last spans, bounded
        if meters is not None:
            shutdown_metrics(meters)
