"""The resident prefix exactly as the router sends it: instructions, then the resident sections in
canonical order, each under its id. Its token ids are hashed so `warm` and the router can prove
they send the same bytes and tokens; for hybrid models it is padded to an attention-block boundary
(only whole blocks are cached, and align mode checkpoints GDN state at block boundaries).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from residency.corpus.model import Section
from residency.errors import ConfigError
from residency.prompt_language import EN, JA, JAPANESE_SHARE, PromptLanguage, japanese_share
from residency.tokenizer import ModelTokenizer

DEFAULT_INSTRUCTIONS = JA.instructions  # the default when a caller names no language
# Fillers appended after a marker line to reach a block boundary; the first whose count fits wins.
PAD_HEADER = "\n\n<!-- padding -->\n"
PAD_UNITS: tuple[str, ...] = ("- ", "-", ". ", "x ", "・")


def date_label(section: Section) -> str:
    """'日付' for a Japanese section, 'date' otherwise (read off its title and first words)."""
    share = japanese_share(section.title + section.text[:200])
    return JA.date_label if share >= JAPANESE_SHARE else EN.date_label


def section_header(section: Section) -> str:
    """'[id: ...] title [日付: YYYY-MM-DD]': how a section or a passage of it is introduced."""
    head = f"[id: {section.id}]"
    if section.title:
        head += f" {section.title}"
    if section.date is not None:
        head += f" [{date_label(section)}: {section.date.isoformat()}]"
    return head


def render_section(section: Section) -> str:
    """One section as it appears in the resident prefix."""
    return f"{section_header(section)}\n{section.text.strip()}"


def render_passage(section: Section, text: str, start_char: int = 0) -> str:
    """A retrieved passage (a chunk's text starting at `start_char` of its section) under its
    section's header and its source, '[source: manual.pdf p. 4]' (the page(s) the passage
    itself is on) or '[source: guide.md#install]', so a reader can open the place an answer came
    from (the resident prefix has no source: its ids are stable keys)."""
    source = section.cite(start_char, start_char + len(text))
    return f"{section_header(section)} [source: {source}]\n{text.strip()}"


def render_prefix(
    instructions: str, sections: Sequence[Section], language: PromptLanguage = JA
) -> str:
    """The system-message content: instructions, then each section separated by a blank line."""
    parts = [instructions.strip(), language.docs_heading]
    parts += [render_section(s) for s in sections]
    return "\n\n".join(parts) + "\n"


@dataclass(frozen=True, slots=True)
class RenderedPrefix:
    """The prefix text, its tokens and hash, and how it was aligned."""

    text: str
    token_count: int
    prefix_hash: str  # sha256 of the token ids (or of the UTF-8 text without a tokenizer)
    hash_of: str  # "token_ids" or "text"
    pad_tokens: int
    aligned_to: int | None  # the block size the prefix ends on, or None


def hash_token_ids(ids: Sequence[int]) -> str:
    """sha256 over the ids as little-endian uint32 — what warm recomputes via /tokenize."""
    digest = hashlib.sha256()
    for token in ids:
        digest.update(int(token).to_bytes(4, "little"))
    return "sha256:" + digest.hexdigest()


def finalize_prefix(text: str, encoder: ModelTokenizer, align_to: int | None) -> RenderedPrefix:
    """Tokenize, pad to a multiple of `align_to` tokens when asked, and hash."""
    count = encoder.count(text)
    padded, pad = text, 0
    if align_to and count % align_to:
        padded, count = _pad_to_multiple(text, encoder, align_to)
        pad = count - encoder.count(text)
    ids = encoder.encode(padded)
    if ids is None:
        digest = "sha256:" + hashlib.sha256(padded.encode("utf-8")).hexdigest()
        return RenderedPrefix(padded, count, digest, "text", pad, align_to)
    return RenderedPrefix(padded, len(ids), hash_token_ids(ids), "token_ids", pad, align_to)


def _pad_to_multiple(text: str, encoder: ModelTokenizer, block: int) -> tuple[str, int]:
    """Append filler until the token count is a multiple of `block`.

    The filler follows a fixed header line, so it starts a new pre-token and its tokens add to
    the text's; candidate fillers are counted alone (cheap) and the winner is verified on the
    whole prefix, since BPE merges can make a suffix's count depend on what precedes it.
    """
    base = text + PAD_HEADER
    base_count = encoder.count(base)
    need = -base_count % block
    for unit in PAD_UNITS:
        for repeat in range(0, 2 * need + 2):
            pad = unit * repeat
            if encoder.count(pad) != need:
                continue
            candidate = base + pad
            count = encoder.count(candidate)
            if count % block == 0:
                return candidate, count
    raise ConfigError(
        f"cannot pad the prefix to a multiple of {block} tokens with this tokenizer; "
        "pass the served model's tokenizer (--tokenizer-dir or --server)"
    )
