"""Child servers in their own process groups: is anything of a group still alive, and make a
child die with its parent. Used by `residency demo` and by the test harness."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path


def group_alive(pgid: int) -> bool:
    """Whether a live (non-zombie) process is still in group `pgid`."""
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: ask the kernel (zombies count as alive there)
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for stat_path in proc.glob("[0-9]*/stat"):
        try:
            stat = stat_path.read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces, so split after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (Linux prctl PR_SET_PDEATHSIG).

    A parent killed outright (SIGKILL, a CI timeout) then still takes a vLLM API server down,
    and vLLM's engine core and worker exit when the API server goes. The signal follows the
    thread that started the child: start servers from a long-lived thread.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
