"""What machine a figure was measured on: CPU model, cores usable, RAM and Python, so a time in
a report or the README always says where it came from (the same step took 10x longer on
another 2-core machine of the same kind)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class MachineInfo(BaseModel):
    """The host a run measured its times on."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    cpu_model: str = Field(max_length=256, description="/proc/cpuinfo's model name.")
    cores: int = Field(ge=1, description="CPUs this process may run on (its affinity).")
    vector_isa: str = Field(
        max_length=64,
        description="Widest vector/matrix extension in the CPU flags (amx_bf16, avx512_bf16, "
        "avx512f, avx2, or none): vLLM's CPU kernels, and its bf16 state rules, depend on it.",
    )
    memory_gib: float | None = Field(ge=0, description="MemTotal, GiB (None if unknown).")
    python: str = Field(max_length=64, description="Python version.")

    def describe(self) -> str:
        """'Intel(R) Xeon(R) Processor (amx_bf16), 2 cores, 24 GiB RAM, Python 3.11.7'."""
        ram = f", {self.memory_gib:.0f} GiB RAM" if self.memory_gib is not None else ""
        return (
            f"{self.cpu_model} ({self.vector_isa}), {self.cores} cores{ram}, Python {self.python}"
        )


def _cpuinfo_field(text: str, name: str) -> str | None:
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name and value.strip():
            return value.strip()
    return None


_ISA_ORDER = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")


def vector_isa(flags: str) -> str:
    """The first of _ISA_ORDER among the cpuinfo flags, else 'none'."""
    present = set(flags.split())
    return next((isa for isa in _ISA_ORDER if isa in present), "none")


def cpu_flags(proc: Path = Path("/proc")) -> frozenset[str]:
    """The CPU feature flags /proc/cpuinfo lists (``flags`` on x86, ``Features`` on Arm); empty
    where there is no such file. Linux clears a flag the OS does not enable (e.g. AVX-512 state),
    so these are the features a program here can use."""
    try:
        text = (proc / "cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    listed = _cpuinfo_field(text, "flags") or _cpuinfo_field(text, "Features") or ""
    return frozenset(listed.split())


def machine_info(proc: Path = Path("/proc")) -> MachineInfo:
    """This machine, read from /proc where it exists (platform's names elsewhere)."""
    try:
        cpuinfo = (proc / "cpuinfo").read_text(errors="replace")
    except OSError:
        cpuinfo = ""
    model = _cpuinfo_field(cpuinfo, "model name") or platform.processor() or platform.machine()
    memory: float | None = None
    try:
        kib = _cpuinfo_field((proc / "meminfo").read_text(), "MemTotal")
        memory = int(kib.split()[0]) / (1 << 20) if kib else None
    except (OSError, ValueError):
        memory = None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return MachineInfo(
        cpu_model=model,
        cores=cores,
        vector_isa=vector_isa(_cpuinfo_field(cpuinfo, "flags") or ""),
        memory_gib=memory,
        python=platform.python_version(),
    )
