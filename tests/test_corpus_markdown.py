"""Markdown through CommonMark (markdown-it-py): the constructs a real vault has, front matter."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from residency.corpus.loader import load_corpus
from residency.corpus.markdown import parse_markdown
from residency.tokenizer import ApproxTokenizer

VAULT = """\
---
title: Pump room
date: 2025-03-04
tags: [pumps, maintenance]
---
Intro before any heading.

Pump room
=========

Setext level 1.

Daily checks
------------

Setext level 2.

> ## Quoted heading {#quoted}
> Text inside the quote.

- ### Heading in a list
  Item text.

<h2 id="raw-id">Raw <em>HTML</em> heading</h2>

After the raw heading.

<div>
# not a heading: inside an HTML block
</div>

    # not a heading: indented code

```
# not a heading: fenced code
```

## Closing hashes ##

End.
"""


def ids_and_titles(text: str) -> list[tuple[str, str, int]]:
    drafts, skipped = parse_markdown("vault/pump", text, "vault/pump.md")
    assert skipped == []
    return [(d.id, d.title, d.line) for d in drafts]


def test_commonmark_headings_anywhere_become_sections() -> None:
    assert ids_and_titles(VAULT) == [
        ("vault/pump#_preamble", "Pump room", 6),  # the front matter's title
        ("vault/pump#pump-room", "Pump room", 8),
        ("vault/pump#daily-checks", "Pump room > Daily checks", 13),
        ("vault/pump#quoted", "Pump room > Quoted heading", 18),
        ("vault/pump#heading-in-a-list", "Pump room > Quoted heading > Heading in a list", 21),
        ("vault/pump#raw-id", "Pump room > Raw HTML heading", 24),
        ("vault/pump#closing-hashes", "Pump room > Closing hashes", 38),
    ]


def test_text_is_the_source_as_written_and_code_stays_text() -> None:
    drafts, _ = parse_markdown("vault/pump", VAULT, "vault/pump.md")
    by_id = {d.id: d for d in drafts}
    assert by_id["vault/pump#_preamble"].text == "Intro before any heading."
    assert by_id["vault/pump#quoted"].text == "> Text inside the quote."
    raw = by_id["vault/pump#raw-id"].text
    assert "# not a heading: inside an HTML block" in raw
    assert "    # not a heading: indented code" in raw
    assert "# not a heading: fenced code" in raw
    assert "title: Pump room" not in "\n".join(d.text for d in drafts)  # front matter is not text


def test_front_matter_date_and_tags_apply_to_every_section() -> None:
    drafts, _ = parse_markdown("vault/pump", VAULT, "vault/pump.md")
    assert {(d.date, d.tags) for d in drafts} == {(dt.date(2025, 3, 4), ("pumps", "maintenance"))}


@pytest.mark.parametrize(
    ("front", "reason"),
    [
        pytest.param("date: [unclosed\n", "front matter: invalid YAML", id="bad-yaml"),
        pytest.param(
            "date: 4 March\n", "front matter: date '4 March' is not YYYY-MM-DD", id="date"
        ),
    ],
)
def test_a_bad_front_matter_is_reported_and_the_file_still_indexed(front: str, reason: str) -> None:
    drafts, skipped = parse_markdown("n", f"---\n{front}---\n# A\n\nbody\n", "n.md")
    assert [d.id for d in drafts] == ["n#a"]
    assert [(s.file, s.line) for s in skipped] == [("n.md", 1)]
    assert skipped[0].reason.startswith(reason)


def test_thematic_break_after_a_blank_line_is_not_a_heading() -> None:
    # '---' under a paragraph is a setext heading in CommonMark; after a blank line it is a
    # rule. The former splitter read both as text.
    text = "# A\n\npara\n\n---\n\nmore\n"
    assert ids_and_titles(text) == [("vault/pump#a", "A", 1)]


def test_ids_are_stable_across_re_index(tmp_path: Path) -> None:
    (tmp_path / "pump.md").write_text(VAULT, encoding="utf-8")
    first = load_corpus(tmp_path, ApproxTokenizer())
    again = load_corpus(tmp_path, ApproxTokenizer(), None)
    assert [s.id for s in first.sections] == [s.id for s in again.sections]
    assert first.sections[1].date == dt.date(2025, 3, 4)
