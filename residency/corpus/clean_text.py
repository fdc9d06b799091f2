"""Characters no indexed text keeps, whatever the reader: control characters (a PDF's `\\x04`
proof boxes, a terminal's escape codes, a text file's bell) and the non-characters U+FFFE /
U+FFFF (pdfium's soft-hyphen marker: "Prae\\ufffesent" reads "Praesent"). Line breaks survive as
``\\n``: CRLF and a lone CR become one, a form feed or vertical tab (an RFC's page break) one too.
"""

from __future__ import annotations

import dataclasses
import re
from bisect import bisect_left

from residency.corpus.drafts import Draft

# Removed: C0 and C1 controls but tab / newline / CR / VT / FF, DEL, U+FFFE, U+FFFF; a CR
# before a newline.
_REMOVED = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f\ufffe\uffff]|\r(?=\n)")
_BREAKS = str.maketrans({"\r": "\n", "\x0b": "\n", "\x0c": "\n"})


def clean_text(text: str) -> str:
    """`text` without control characters and non-characters (see the module docstring).

    >>> clean_text("Prae\\ufffesent\\x04 ok\\r\\nnext")
    'Praesent ok\\nnext'
    """
    return _REMOVED.sub("", text).translate(_BREAKS)


def clean_draft(draft: Draft) -> Draft:
    """`draft` with its text and title cleaned; a PDF's page-break offsets moved with the text."""
    removed = [m.start() for m in _REMOVED.finditer(draft.text)]
    title = clean_text(draft.title)
    if not removed and title == draft.title and not any(c in draft.text for c in "\r\x0b\x0c"):
        return draft
    breaks = tuple(b - bisect_left(removed, b) for b in draft.page_breaks)
    return dataclasses.replace(draft, text=clean_text(draft.text), title=title, page_breaks=breaks)
