"""A stand-in for nvidia-ml-py's `pynvml`, for the tests of `--gpu auto` on machines without a
GPU: the same names residency calls, answering from the JSON list in $NVML_STANDIN_DEVICES
(objects with name, uuid, total, free). $NVML_STANDIN_DEVICES unset: no driver, as NVML says
when libnvidia-ml is missing. Put this directory first on PYTHONPATH."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    """pynvml's error class."""


def _devices() -> list[dict[str, Any]]:
    raw = os.environ.get("NVML_STANDIN_DEVICES")
    if raw is None:
        raise NVMLError("NVML Shared Library Not Found")
    devices: list[dict[str, Any]] = json.loads(raw)
    return devices


_initialised = 0


def nvmlInit() -> None:  # noqa: N802 (pynvml's names)
    global _initialised
    _devices()
    _initialised += 1


def nvmlShutdown() -> None:  # noqa: N802
    global _initialised
    if _initialised <= 0:
        raise NVMLError("Uninitialized")
    _initialised -= 1


def _check() -> list[dict[str, Any]]:
    if _initialised <= 0:
        raise NVMLError("Uninitialized")
    return _devices()


def nvmlDeviceGetCount() -> int:  # noqa: N802
    return len(_check())


def nvmlDeviceGetHandleByIndex(index: int) -> int:  # noqa: N802
    if not 0 <= index < len(_check()):
        raise NVMLError("Invalid Argument")
    return index


def nvmlDeviceGetHandleByUUID(uuid: str) -> int:  # noqa: N802
    for i, device in enumerate(_check()):
        if device["uuid"] == uuid:
            return i
    raise NVMLError("Not Found")


def nvmlDeviceGetIndex(handle: int) -> int:  # noqa: N802
    return handle


def nvmlDeviceGetUUID(handle: int) -> str:  # noqa: N802
    return str(_check()[handle]["uuid"])


def nvmlDeviceGetName(handle: int) -> bytes:  # noqa: N802
    return str(_check()[handle]["name"]).encode()  # older pynvml returned bytes


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:  # noqa: N802
    device = _check()[handle]
    total, free = int(device["total"]), int(device["free"])
    return SimpleNamespace(total=total, free=free, used=total - free)
