"""A stand-in upstream whose /health answers late while a flag file exists: a vLLM server too
busy to answer a health probe in time. Tests only
(`python tests/slow_health_upstream.py PORT FLAG_FILE`); answers /health and /v1/models, nothing
else."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from stand_in_http import json_response, serve

LATE_S = 30.0  # far beyond the router's 5 s probe timeout
MODELS = b'{"object": "list", "data": [{"id": "slow-health", "object": "model"}]}'


def main(port: int, flag: Path) -> None:
    async def answer(_: bytes, path: bytes, __: bytes, writer: asyncio.StreamWriter) -> None:
        if path == b"/health":
            if flag.exists():
                await asyncio.sleep(LATE_S)
            writer.write(json_response(b""))
        elif path == b"/v1/models":
            writer.write(json_response(MODELS))
        else:
            writer.write(json_response(b'{"error": "not found"}', b"404 Not Found"))

    serve(port, answer)


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]))
