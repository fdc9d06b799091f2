"""Start the router under uvicorn."""

from __future__ import annotations

import logging
import socket

from residency.errors import ConfigError
from residency.serve.app import create_app
from residency.serve.canary import read_canary
from residency.serve.drain import SHUTDOWN_GRACE_S, Drain, draining_server
from residency.serve.protocol import header_limited_protocol
from residency.serve.replan import check_replan
from residency.serve.settings import ServeSettings
from residency.serve.state import load_state


def run_server(settings: ServeSettings) -> None:
    """Load the plan and index, then serve until SIGINT/SIGTERM (uvicorn; SIGTERM drains
    first, residency/serve/drain.py); SIGHUP reloads the plan."""
    import uvicorn

    _check_port(settings.host, settings.port)
    check_replan(settings)
    if settings.agent.canary is not None:
        read_canary(settings.agent.canary)  # a bad labelled set is refused before serving
    serving = load_state(settings)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    drain = Drain(settings.shutdown_timeout_s)
    config = uvicorn.Config(
        create_app(settings, serving, drain),
        host=settings.host,
        port=settings.port,
        log_level="info",
        access_log=False,
        http=header_limited_protocol(settings.limits),
        # past --shutdown-timeout: by then the router has answered every request itself
        timeout_graceful_shutdown=int(settings.shutdown_timeout_s + SHUTDOWN_GRACE_S),
    )
    draining_server(config, drain).run()


def _check_port(host: str, port: int) -> None:
    """Fail with the flag to change before loading anything when the address is taken."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(
                f"--host {host} --port {port}: cannot listen there ({exc.strerror}); "
                "pick another --port or stop what holds it"
            ) from None
