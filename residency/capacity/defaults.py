"""What `residency plan` sizes when no --gpu / --model is given: names only, so the command's
`--help` shows them without loading the profiles."""

from __future__ import annotations

DEFAULT_PROFILE = "rtx4070-12gb"
DEFAULT_MODEL = "qwen3.5-4b-fp8"
