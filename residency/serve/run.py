"""Start the router under uvicorn."""

from __future__ import annotations

import logging

from residency.serve.app import create_app, load_builder
from residency.serve.settings import ServeSettings


def run_server(settings: ServeSettings) -> None:
    """Load the plan and index, then serve until SIGINT/SIGTERM (uvicorn)."""
    import uvicorn

    builder = load_builder(settings)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = uvicorn.Config(
        create_app(settings, builder),
        host=settings.host,
        port=settings.port,
        log_level="info",
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    uvicorn.Server(config).run()
