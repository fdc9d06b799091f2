"""Regenerate the reference texts of the real-document benchmark (tests/real_documents/).

Each reference comes from an extractor independent of residency's readers:

- PDF: poppler's ``pdftotext -enc UTF-8`` (Debian poppler-utils); an encrypted or scanned file
  gets an empty reference (it is expected to be skipped);
- HTML: lxml on the page's main element (the manifest's ``main_xpath``), scripts, styles,
  navigation, edit links and the table of contents removed, one block per line;
- DOCX: the document's own XML: every ``w:t`` of the body, text boxes (once: the ``mc:Choice``
  branch), footnotes, endnotes and OMML ``m:t``, not comments nor deleted text;
- Markdown and text: the file itself (a Markdown front matter block is left out but its
  ``title:`` kept).

Usage: ``python scripts/real_document_references.py [FOLDER]`` (default tests/real_documents).
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import lxml.etree
import lxml.html

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from residency.eval.real_documents import RealDocument, load_manifest

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
M = "http://schemas.openxmlformats.org/officeDocument/2006/math"
MC = "http://schemas.openxmlformats.org/markup-compatibility/2006"
STRICT_W = "http://purl.oclc.org/ooxml/wordprocessingml/main"
STRICT_M = "http://purl.oclc.org/ooxml/officeDocument/math"

# Not main text on any page: code that is not shown, navigation, edit links, tables of contents.
HTML_DROP = (
    "//script | //style | //noscript | //template | //nav | //*[@role='navigation']"
    " | //*[contains(concat(' ', @class, ' '), ' mw-editsection ')]"
    " | //*[@id='toc'] | //*[contains(concat(' ', @class, ' '), ' headerlink ')]"
    " | //*[contains(concat(' ', @class, ' '), ' navbox ')]"
    " | //*[contains(concat(' ', @class, ' '), ' vertical-navbox ')]"
)
HTML_BLOCKS = {
    "p",
    "div",
    "section",
    "article",
    "main",
    "li",
    "tr",
    "table",
    "pre",
    "blockquote",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "dt",
    "dd",
    "ul",
    "ol",
    "dl",
    "figure",
    "figcaption",
    "header",
    "footer",
    "aside",
    "br",
    "hr",
    "td",
    "th",
    "caption",
    "form",
}


def pdf_reference(path: Path) -> str:
    """pdftotext's text, '' when poppler cannot read it (encrypted)."""
    done = subprocess.run(
        ["pdftotext", "-enc", "UTF-8", str(path), "-"], capture_output=True, check=False
    )
    return done.stdout.decode("utf-8") if done.returncode == 0 else ""


def _html_text(el: lxml.html.HtmlElement) -> str:
    parts: list[str] = []

    def walk(node: lxml.html.HtmlElement) -> None:
        block = isinstance(node.tag, str) and node.tag in HTML_BLOCKS
        if block:
            parts.append("\n")
        if node.text and isinstance(node.tag, str):
            parts.append(node.text)
        for child in node:
            walk(child)
            if child.tail:
                parts.append(child.tail)
        if block:
            parts.append("\n")

    walk(el)
    lines = (" ".join(line.split()) for line in "".join(parts).splitlines())
    return "\n".join(line for line in lines if line) + "\n"


def html_reference(path: Path, main_xpath: str | None) -> str:
    """The text of the page's main element, one block a line."""
    tree = lxml.html.document_fromstring(path.read_bytes())
    for el in tree.xpath(HTML_DROP):
        el.drop_tree()
    found = tree.xpath(main_xpath or "//body")
    return "".join(_html_text(el) for el in found)


def _xml_text(root: lxml.etree._Element, w: str, m: str) -> str:
    for fallback in root.iter(f"{{{MC}}}Fallback"):
        fallback.clear()
    lines: list[str] = []
    for para in root.iter(f"{{{w}}}p"):
        runs = [
            t.text or ""
            for t in para.iter(f"{{{w}}}t", f"{{{m}}}t")
            if next(t.iterancestors(f"{{{w}}}p"), None) is para
        ]
        line = "".join(runs).strip()
        if line:
            lines.append(line)
    return "\n".join(lines) + ("\n" if lines else "")


def docx_reference(path: Path) -> str:
    """Body, text boxes, footnotes, endnotes and equations from the document's XML."""
    out: list[str] = []
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        for part in ("word/document.xml", "word/footnotes.xml", "word/endnotes.xml"):
            if part not in names:
                continue
            root = lxml.etree.fromstring(z.read(part))
            strict = root.tag.startswith(f"{{{STRICT_W}}}")
            out.append(_xml_text(root, STRICT_W if strict else W, STRICT_M if strict else M))
    return "".join(out)


_FRONT_MATTER = re.compile(r"\A---\n(.*?)\n---\n", re.S)
_HEADING_ATTRS = re.compile(r"^(#{1,6} .*?)[ \t]*\{#[^{}]*\}[ \t]*$", re.M)  # markup, not text


def markdown_reference(path: Path) -> str:
    """The file, its front matter block replaced by its title, heading ``{#id}`` attributes
    left out."""
    text = _HEADING_ATTRS.sub(r"\1", path.read_text(encoding="utf-8-sig"))
    found = _FRONT_MATTER.match(text)
    if found is None:
        return text
    title = re.search(r"^title:\s*(.+)$", found.group(1), re.M)
    return (title.group(1).strip() + "\n\n" if title else "") + text[found.end() :]


def reference_text(folder: Path, doc: RealDocument) -> str:
    """The reference text of one benchmark file."""
    path = folder / doc.path
    if doc.format == "pdf":
        return pdf_reference(path)
    if doc.format == "html":
        return html_reference(path, doc.main_xpath)
    if doc.format == "docx":
        return docx_reference(path)
    if doc.format == "markdown":
        return markdown_reference(path)
    return path.read_text(encoding="utf-8-sig")


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/real_documents")
    manifest = load_manifest(folder)
    for doc in manifest.files:
        out = folder / doc.reference
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(reference_text(folder, doc), encoding="utf-8")
    print(f"{len(manifest.files)} references written under {folder}")


if __name__ == "__main__":
    main()
