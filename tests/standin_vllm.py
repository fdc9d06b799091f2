"""A stand-in for `python -m vllm.entrypoints.openai.api_server` that never becomes healthy: it
forks a child (as vLLM's API server forks its engine core) and both wait to be stopped. The demo's
SIGTERM test starts it through `residency demo --python`; every argument is ignored."""

from __future__ import annotations

import os
import time

if __name__ == "__main__":
    os.fork()  # parent and child alike: the "API server" and its "engine core"
    while True:
        time.sleep(3600)
