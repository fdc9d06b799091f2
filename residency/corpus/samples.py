"""The built-in sample corpora: the Japanese `harbor-lights` (the default everywhere) and its
English twin `harbor-lights-en` (same facts, section ids and questions; for English-first
models such as SmolLM2-135M). Each has its docs, a query log for the planner and a question set
with gold section ids for `eval answers`.

The English twin is chunked at 800 characters: the chunker's default of 256 is sized for
Japanese, where 256 characters hold about as many tokens (and facts) as 800 English ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import Field

from residency.errors import ConfigError
from residency.flags import Flag
from residency.paths import data_root

# Package data (residency/data): the folder that holds corpora/ (and profiles/).
DATA_ROOT = data_root()
CORPORA_DIR = DATA_ROOT / "corpora"


@dataclass(frozen=True, slots=True)
class SampleCorpus:
    """One built-in corpus under residency/data/corpora/NAME/."""

    name: str
    chunk_chars: int | None  # None: the chunker's default

    @property
    def root(self) -> Path:
        """residency/data/corpora/NAME."""
        return CORPORA_DIR / self.name

    @property
    def docs(self) -> Path:
        """The corpus files `residency index` reads."""
        return self.root / "docs"

    @property
    def queries(self) -> Path:
        """The simulated query log (query, count, ts) the planner reads."""
        return self.root / "queries.jsonl"

    @property
    def questions(self) -> Path:
        """The evaluation questions (id, query, relevant_ids, type, answer)."""
        return self.root / "qa.jsonl"


JA_SAMPLE = SampleCorpus("harbor-lights", chunk_chars=None)
EN_SAMPLE = SampleCorpus("harbor-lights-en", chunk_chars=800)
SAMPLES: dict[str, SampleCorpus] = {s.name: s for s in (JA_SAMPLE, EN_SAMPLE)}
DEFAULT_SAMPLE = JA_SAMPLE.name


def get_sample(name: str) -> SampleCorpus:
    """The sample corpus called `name`; ConfigError naming the known ones."""
    try:
        return SAMPLES[name]
    except KeyError:
        raise ConfigError(
            f"--sample {name!r}: no such sample corpus; known: {', '.join(SAMPLES)}"
        ) from None


SAMPLE_HELP = (
    f"Built-in sample corpus used when no --index is given: {', '.join(SAMPLES)} (its English "
    "twin, for English-first models)."
)
SampleName = Annotated[
    str | None,
    Flag(show_default=DEFAULT_SAMPLE),
    Field(description=SAMPLE_HELP),
]
"""`--sample`: None is the default corpus (DEFAULT_SAMPLE); a command that builds on an index
reads it only when no --index is given."""
