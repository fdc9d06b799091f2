"""The answer eval's defaults, apart from its models and clients, so `residency eval answers
--help` reads them without building either."""

from __future__ import annotations

DEFAULT_K = 3  # the reference measurement's RAG top-3 (docs/design/background.md)
DEFAULT_MAX_TOKENS = 256
DEFAULT_JUDGE_MAX_TOKENS = 64
