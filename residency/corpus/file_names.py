"""File names and messages as text any model, table or JSON can hold: a name that is not valid
UTF-8 (Linux keeps names as bytes) is shown with its undecodable bytes escaped, so one odd file
name never aborts a run."""

from __future__ import annotations


def printable(text: str) -> str:
    r"""`text` with the surrogates Python decodes undecodable bytes to (``os.fsdecode``)
    written as ``\xNN`` escapes; valid text unchanged.

    >>> printable("caf\udce9.md")
    'caf\\xe9.md'
    >>> printable("灯台.md")
    '灯台.md'
    """
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no byte decodes to
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")
