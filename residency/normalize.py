"""The one text normalisation used for indexing and for querying (a mismatch silently costs
recall, so both sides call this function and the index manifest records its version)."""

from __future__ import annotations

import re
import unicodedata

NORMALIZATION_VERSION = "nfkc-ws-v1"

_SPACES = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """NFKC (full-width ASCII and half-width kana folded), whitespace runs collapsed, trimmed.

    >>> normalize_text("ＡＢＣ　１２３\\n ｶﾀｶﾅ")
    'ABC 123 カタカナ'
    """
    return _SPACES.sub(" ", unicodedata.normalize("NFKC", text)).strip()
