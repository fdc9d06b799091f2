"""The DOCX reader on what Word files really hold: text boxes (once, not the fallback copy too),
footnotes and endnotes, equations, comments, tracked changes and Strict OOXML (.docx files
written here from their XML parts, read by the real python-docx)."""

from __future__ import annotations

import io
import zipfile

import lxml.etree
import pytest

from residency.corpus.docx_text import M_NS, omml_text
from residency.corpus.drafts import Draft
from residency.corpus.word import read_docx

W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
R_NS = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
PKG_RELS = "http://schemas.openxmlformats.org/package/2006/relationships"
NS = (
    f'xmlns:w="{W_NS}" xmlns:m="{M_NS}" xmlns:r="{R_NS}" '
    'xmlns:mc="http://schemas.openxmlformats.org/markup-compatibility/2006" '
    'xmlns:wps="http://schemas.microsoft.com/office/word/2010/wordprocessingShape" '
    'xmlns:v="urn:schemas-microsoft-com:vml"'
)
MAIN = "application/vnd.openxmlformats-officedocument.wordprocessingml"
STRICT = {
    W_NS: "http://purl.oclc.org/ooxml/wordprocessingml/main",
    M_NS: "http://purl.oclc.org/ooxml/officeDocument/math",
    R_NS: "http://purl.oclc.org/ooxml/officeDocument/relationships",
}


def p(inner: str, heading: int | None = None) -> str:
    """A paragraph; `heading` 1.. sets an outline level (what a heading style gives)."""
    ppr = f'<w:pPr><w:outlineLvl w:val="{heading - 1}"/></w:pPr>' if heading else ""
    return f"<w:p>{ppr}{inner}</w:p>"


def r(text: str) -> str:
    return f'<w:r><w:t xml:space="preserve">{text}</w:t></w:r>'


def make_docx(body: str, parts: dict[str, str] | None = None, strict: bool = False) -> bytes:
    """A .docx with `body` in its document and extra parts ('footnotes', 'endnotes',
    'comments': their XML), optionally in Strict OOXML namespaces."""
    parts = parts or {}
    rels = "".join(
        f'<Relationship Id="rId{n}" Type="{R_NS}/{name}" Target="{name}.xml"/>'
        for n, name in enumerate(parts, start=1)
    )
    types = "".join(
        f'<Override PartName="/word/{name}.xml" ContentType="{MAIN}.{name}+xml"/>' for name in parts
    )
    files = {
        "[Content_Types].xml": (
            '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
            '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.'
            'relationships+xml"/><Default Extension="xml" ContentType="application/xml"/>'
            f'<Override PartName="/word/document.xml" ContentType="{MAIN}.document.main+xml"/>'
            f"{types}</Types>"
        ),
        "_rels/.rels": (
            f'<Relationships xmlns="{PKG_RELS}"><Relationship Id="rId1" '
            f'Type="{R_NS}/officeDocument" Target="word/document.xml"/></Relationships>'
        ),
        "word/_rels/document.xml.rels": f'<Relationships xmlns="{PKG_RELS}">{rels}</Relationships>',
        "word/document.xml": f"<w:document {NS}><w:body>{body}</w:body></w:document>",
        **{f"word/{name}.xml": xml for name, xml in parts.items()},
    }
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name, xml in files.items():
            if strict:
                for usual, strict_ns in STRICT.items():
                    xml = xml.replace(usual, strict_ns)
            zf.writestr(name, xml)
    return out.getvalue()


def _read(data: bytes) -> list[Draft]:
    drafts, skipped = read_docx("doc.docx", data)
    assert skipped == []
    return drafts


def _text(drafts: list[Draft]) -> str:
    return "\n".join(d.text for d in drafts)


def test_a_text_box_is_read_once_after_its_paragraph() -> None:
    box = p(r("Datum plane"))
    drawing = (
        "<w:r><mc:AlternateContent><mc:Choice Requires='wps'><w:drawing><wps:txbx>"
        f"<w:txbxContent>{box}</w:txbxContent></wps:txbx></w:drawing></mc:Choice>"
        "<mc:Fallback><w:pict><v:textbox>"
        f"<w:txbxContent>{box}</w:txbxContent></v:textbox></w:pict></mc:Fallback>"
        "</mc:AlternateContent></w:r>"
    )
    text = _text(_read(make_docx(p(r("Figure 1.") + drawing) + p(r("After it.")))))
    assert text == "Figure 1.\n\nDatum plane\n\nAfter it."


def _notes(kind: str, notes: dict[str, str]) -> str:
    body = "".join(f'<w:{kind} w:id="{n}">{p(r(text))}</w:{kind}>' for n, text in notes.items())
    separator = f'<w:{kind} w:type="separator" w:id="-1">{p(r("----"))}</w:{kind}>'
    return f"<w:{kind}s {NS}>{separator}{body}</w:{kind}s>"


def test_footnotes_and_endnotes_follow_the_paragraph_that_cites_them() -> None:
    body = (
        p(r("Usage"), heading=1)
        + p(r("Ouch") + '<w:r><w:footnoteReference w:id="2"/></w:r>' + r("."))
        + p(r("Later") + '<w:r><w:endnoteReference w:id="5"/></w:r>')
        + p(r("Last paragraph."))
    )
    parts = {
        "footnotes": _notes("footnote", {"2": "A tachyon walks into a bar."}),
        "endnotes": _notes("endnote", {"5": "Fin."}),
    }
    (draft,) = _read(make_docx(body, parts))
    assert draft.title == "Usage"
    assert draft.text == (
        "Ouch[1].\n[1] A tachyon walks into a bar.\n\nLater[i]\n[i] Fin.\n\nLast paragraph."
    )
    assert "----" not in draft.text


def test_comments_are_left_out_and_tracked_changes_applied() -> None:
    body = p(
        '<w:commentRangeStart w:id="0"/>'
        + r("Kept text")
        + '<w:ins w:id="1" w:author="a">'
        + r(" inserted")
        + "</w:ins>"
        + '<w:del w:id="2" w:author="a"><w:r><w:delText> deleted</w:delText></w:r></w:del>'
        + '<w:commentRangeEnd w:id="0"/><w:r><w:commentReference w:id="0"/></w:r>'
        + r(".")
    )
    comments = (
        f'<w:comments {NS}><w:comment w:id="0">{p(r("A reviewer remark"))}</w:comment></w:comments>'
    )
    text = _text(_read(make_docx(body, {"comments": comments})))
    assert text == "Kept text inserted."


def _math(inner: str) -> str:
    return f"<m:oMath {NS}>{inner}</m:oMath>"


SIN = "sin\u2061"  # with the invisible FUNCTION APPLICATION Word puts after a function name


def mr(text: str) -> str:
    return f"<m:r><m:t>{text}</m:t></m:r>"


@pytest.mark.parametrize(
    ("omml", "expected"),
    [
        (f"<m:f><m:num>{mr('a+b')}</m:num><m:den>{mr('2')}</m:den></m:f>", "(a+b)/2"),
        (f"<m:sSub><m:e>{mr('x')}</m:e><m:sub>{mr('i')}</m:sub></m:sSub>", "x_i"),
        (f"<m:sSup><m:e>{mr('x')}</m:e><m:sup>{mr('-1')}</m:sup></m:sSup>", "x^(-1)"),
        (f"<m:rad><m:deg/><m:e>{mr('x+1')}</m:e></m:rad>", "√(x+1)"),
        (f"<m:rad><m:deg>{mr('3')}</m:deg><m:e>{mr('x')}</m:e></m:rad>", "root(3, x)"),
        (
            '<m:nary><m:naryPr><m:chr m:val="∑"/></m:naryPr>'
            f"<m:sub>{mr('i=1')}</m:sub><m:sup>{mr('n')}</m:sup>"
            f"<m:e><m:sSub><m:e>{mr('x')}</m:e><m:sub>{mr('i')}</m:sub></m:sSub></m:e></m:nary>",
            "∑_(i=1)^n x_i",
        ),
        (f"<m:func><m:fName>{mr(SIN)}</m:fName><m:e>{mr('θ')}</m:e></m:func>", "sin θ"),
        (f"<m:d><m:e>{mr('x')}</m:e><m:e>{mr('y')}</m:e></m:d>", "(x|y)"),
    ],
    ids=["fraction", "sub", "sup", "sqrt", "root", "nary", "function", "delimiter"],
)
def test_an_equation_becomes_linear_text(omml: str, expected: str) -> None:
    assert omml_text(lxml.etree.fromstring(_math(omml))) == expected


def test_equations_are_text_in_their_sentence() -> None:
    frac = f"<m:f><m:num>{mr('m')}</m:num><m:den>{mr('a')}</m:den></m:f>"
    body = p(
        r("For ")
        + f"<m:oMath>{mr('m=1')}</m:oMath>"
        + r(", ")
        + f"<m:oMath>{mr(SIN + 'θ=')}{frac}</m:oMath>"
    )
    assert _text(_read(make_docx(body))) == "For m=1, sin θ=m/a"


def test_a_strict_ooxml_file_is_read() -> None:
    body = p(r("Strict title"), heading=1) + p(r("Body of a Strict OOXML document."))
    (draft,) = _read(make_docx(body, strict=True))
    assert draft.title == "Strict title"
    assert draft.text == "Body of a Strict OOXML document."


def test_a_file_that_is_not_a_docx_is_skipped_with_the_reason() -> None:
    drafts, skipped = read_docx("old.docx", b"\xd0\xcf\x11\xe0 a Word 97 file")
    assert drafts == []
    assert "not .doc or encrypted" in skipped[0].reason


def test_ruby_keeps_its_base_text_and_a_table_of_contents_is_left_out() -> None:
    ruby = (
        "<w:r><w:ruby><w:rt><w:r><w:t>かんじ</w:t></w:r></w:rt>"
        "<w:rubyBase><w:r><w:t>漢字</w:t></w:r></w:rubyBase></w:ruby></w:r>"
    )
    toc = (
        "<w:sdt><w:sdtPr><w:docPartObj>"
        '<w:docPartGallery w:val="Table of Contents"/></w:docPartObj></w:sdtPr>'
        f"<w:sdtContent>{p(r('目次'))}{p(r('はじめに 3'))}</w:sdtContent></w:sdt>"
    )
    body = toc + p(r("はじめに"), heading=1) + p(ruby + r("の読み方。"))
    (draft,) = _read(make_docx(body))
    assert draft.title == "はじめに"
    assert draft.text == "漢字の読み方。"


def test_a_content_control_other_than_contents_is_read() -> None:
    control = f"<w:sdt><w:sdtPr/><w:sdtContent>{p(r('Filled in field.'))}</w:sdtContent></w:sdt>"
    assert _text(_read(make_docx(control + p(r("After."))))) == "Filled in field.\n\nAfter."


def test_a_heading_with_no_text_under_it_is_kept_as_text() -> None:
    (alone,) = _read(make_docx(p(r("A Numbered Header."), heading=1)))
    assert alone.text == "A Numbered Header."
    body = (
        p(r("Guide"), heading=1)
        + p(r("Intro text."))
        + p(r("Empty chapter"), heading=1)
        + p(r("Usage"), heading=1)
        + p(r("Run it."))
    )
    drafts = _read(make_docx(body))
    assert [(d.title, d.text) for d in drafts] == [
        ("Guide", "Intro text.\n\nEmpty chapter"),
        ("Usage", "Run it."),
    ]
