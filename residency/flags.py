"""Command-line facts a settings field carries: `Flag` (another spelling, a short name, a help
panel, an environment variable) and `Section` (for a nested model's fields). Plain data, read by
the CLI (`residency/cli/spec.py`), which builds every command's options from its settings model:
the field holds the name, type, bounds, default and help; these hold what only a command line has.

    question_tokens: Annotated[int, Flag("--reserve-question", panel="Reserves")] = Field(...)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from pydantic import Field

DEFAULT_REQUEST_TIMEOUT_S = 600.0
DEFAULT_VLLM_URL = "http://127.0.0.1:8000"
"""Where `vllm serve` listens by default: the server `warm` and `bench` talk to without
--server."""


@dataclass(frozen=True)
class Flag:
    """Command-line facts of one field: its spellings (`--reserve-question`, `-tp`,
    `--x/--no-x`), the help panel, whether to show the default, an environment variable, and
    whether a tuple is one comma-separated value rather than a repeatable option."""

    decls: tuple[str, ...] = ()
    panel: str | None = None
    show_default: bool | str = True  # a text shows in place of the value ("CACHE/coverage")
    envvar: str | None = None
    comma: bool = False  # a tuple given as one comma-separated value ("2000,8000")
    argument: bool = False  # positional, not an option
    metavar: str | None = None  # what the help shows for the value ("qdrant URL|PATH")

    def __init__(
        self,
        *decls: str,
        panel: str | None = None,
        show_default: bool | str = True,
        envvar: str | None = None,
        comma: bool = False,
        argument: bool = False,
        metavar: str | None = None,
    ) -> None:
        object.__setattr__(self, "decls", decls)
        object.__setattr__(self, "panel", panel)
        object.__setattr__(self, "show_default", show_default)
        object.__setattr__(self, "envvar", envvar)
        object.__setattr__(self, "comma", comma)
        object.__setattr__(self, "argument", argument)
        object.__setattr__(self, "metavar", metavar)


@dataclass(frozen=True)
class Section:
    """A nested-model field whose fields become options: their panel (`panel`, or per field in
    `panels`), and `Flag`s for fields of a model that carries none (`flags`)."""

    panel: str | None = None
    panels: Mapping[str, str] = field(default_factory=dict)
    flags: Mapping[str, Flag] = field(default_factory=dict)
    skip: frozenset[str] = frozenset()  # fields the command line leaves at their defaults


# Options several commands share, declared once: the field's type, default, bounds, help and
# command-line facts. A command's model takes the alias as its field's type
# (`json_output: JsonOutput`), so `--json` reads the same on every command
# (tests/test_flag_declarations.py holds every flag name to one declaration).
JsonOutput = Annotated[
    bool,
    Flag("--json"),
    Field(
        description="Print the result as one JSON object on stdout (--watch: one per line); "
        "progress goes to stderr.",
    ),
]
VllmServer = Annotated[
    str | None,
    Flag(metavar="URL"),
    Field(
        min_length=1,
        max_length=4096,
        description="Base URL of a running vLLM server: its own numbers (KV cache, "
        "max_model_len, tokenizer) replace the modelled ones (warm and bench talk to it; "
        f"default for them: {DEFAULT_VLLM_URL}).",
    ),
]
VllmApiKey = Annotated[
    str | None,
    Flag("--vllm-api-key", envvar="VLLM_API_KEY"),
    Field(
        max_length=4096,
        repr=False,
        description="Bearer token for the vLLM servers (their --api-key).",
    ),
]
RouterApiKey = Annotated[
    str | None,
    Flag("--api-key", envvar="RESIDENCY_API_KEY"),
    Field(
        min_length=8,
        max_length=4096,
        repr=False,
        validate_default=True,  # `serve` refuses a host beyond loopback without one
        description="Bearer token of the router: `serve` requires it on every path but /health, "
        "clients (`status`, `eval answers`) send it.",
    ),
]
Questions = Annotated[
    Path | None,
    Flag(show_default="the --sample corpus's qa.jsonl"),
    Field(
        description="Questions, jsonl: query, relevant_ids (gold section ids), optional id, "
        "type and answer (the reference `eval answers` scores against).",
    ),
]
IndexDir = Annotated[
    Path | None,
    Flag("--index"),
    Field(
        description="Index directory from `residency index` (default: the plan's, or the "
        "--sample corpus's, built under the cache directory on first use).",
    ),
]
TokenizerDir = Annotated[
    Path | None,
    Field(
        description="Local model directory with the served model's tokenizer.json, for token "
        "counts (default: the plan's; --server: the server's /tokenize).",
    ),
]
SquadFile = Annotated[
    Path | None,
    Field(
        description="SQuAD-style JSON to simulate traffic over, e.g. "
        "../shared/data/jsquad/valid-v1.3.json (imported and indexed under --cache-dir).",
    ),
]
Watch = Annotated[
    bool,
    Field(
        description="Keep running until Ctrl-C or SIGTERM: `index` re-reads and re-embeds only "
        "the corpus files added, edited or removed; `warm` probes every prefix each --interval s "
        "and re-warms only one that missed, waiting out restarts; `status` redraws in place.",
    ),
]
RequestTimeout = Annotated[
    float,
    Flag("--request-timeout"),
    Field(gt=0, le=86_400, description="Seconds one request to vLLM may take."),
]
MaxModelLen = Annotated[
    int | None,
    Flag(show_default=False),
    Field(
        ge=1,
        le=10**8,
        description="--max-model-len: the context window, tokens, as vLLM's flag (default: "
        "derived, as vLLM does: a --server's own, else the model's limit up to 32,768; "
        "`eval coverage` models a host only with --kv-cache-tokens and this).",
    ),
]
Replicas = Annotated[
    int,
    Flag(show_default=True),
    Field(
        ge=1,
        le=1024,
        description="A fleet of this many identical replicas: the prefixes they hold placed over "
        "them, the hottest replicated, the rest sharded (plan.json's placement; `eval coverage "
        "--squad` adds the row placement-N).",
    ),
]
Output = Annotated[
    Path | None,
    Flag("--output", "-o", show_default=False),
    Field(
        description="Where the result goes, written atomically: `plan`'s plan.json (default: "
        "./plan.json); `index`'s index directory (required), replaced when done.",
    ),
]
