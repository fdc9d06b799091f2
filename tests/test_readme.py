"""The README and docs/ stay true: the README is short and starts with the two fresh-machine
commands, the CLI reference (docs/cli.md) is generated from the CLI itself, and every relative
link points at a file (and a heading) that exists."""

from __future__ import annotations

import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "readme_help.py"
README_MAX_LINES = 300
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--check", "--file", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_reference_matches_the_cli() -> None:
    out = _check(ROOT / "docs" / "cli.md")
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_stale_or_incomplete_cli_reference_is_caught(tmp_path: Path) -> None:
    stale = tmp_path / "cli.md"
    stale.write_text("<!-- help: residency profiles -->\n```text\nold\n```\n<!-- /help -->\n")
    out = _check(stale)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "help blocks are stale" in out.stdout, out.stdout
    assert "no help block for: residency plan, " in out.stdout, out.stdout
    assert "residency profiles" not in out.stdout.split("no help block for:")[1]


def test_readme_starts_with_the_two_fresh_machine_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    first_block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    assert "make install && .venv/bin/residency demo" in first_block
    assert "make test" in first_block


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines, the limit is {README_MAX_LINES}: move detail to docs/"
    )


FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """Markdown without fenced blocks and code spans (links there are not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading id of a markdown file (GitHub's numbering of repeats included)."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text("utf-8"))):
        slug = github_anchor(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(doc: Path) -> list[str]:
    """The relative links of a markdown file whose file, or heading, does not exist."""
    broken = []
    for target in LINK.findall(_prose(doc.read_text("utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no such heading)")
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_relative_links_point_at_files_and_headings(doc: Path) -> None:
    broken = broken_links(doc)
    assert not broken, f"{doc.relative_to(ROOT)}: broken links: " + "; ".join(broken)


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## `residency plan`: a heading\n")
    doc = tmp_path / "page.md"
    doc.write_text(
        "# Page\n\n[ok](other.md) [ok](other.md#residency-plan-a-heading) [ok](#page)\n"
        "[web](https://example.com/x.md) `[code](nowhere.md)`\n\n```\n[code](gone.md)\n```\n"
        "[gone](gone.md) [bad anchor](other.md#nope) ![picture](pic.png) [self](#nothing)\n"
    )
    assert broken_links(doc) == [
        "gone.md (no such file)",
        "other.md#nope (no such heading)",
        "pic.png (no such file)",
        "#nothing (no such heading)",
    ]


def test_anchor_rule_matches_github() -> None:
    assert github_anchor("`residency plan`: KV-cache capacity and the resident budget") == (
        "residency-plan-kv-cache-capacity-and-the-resident-budget"
    )
    assert github_anchor("Scaling out: Qdrant and several routers") == (
        "scaling-out-qdrant-and-several-routers"
    )
    assert github_anchor("`residency corpus import-squad`") == "residency-corpus-import-squad"
