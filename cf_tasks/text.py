"""Text normalisation and phrase matching shared by the builders' validator and the scorer.

Matching is on word boundaries, case-insensitive and accent-insensitive: text and phrase are both
folded to lower-case ASCII words, and a phrase is present when its word sequence occurs as a
contiguous run of the text's words ("USA" is not in "usage", "Durres" is in "Durrës").
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

# Letters that NFKD does not decompose into a base letter plus accents.
_TRANSLITERATION = str.maketrans(
    {
        "ø": "o", "Ø": "O", "æ": "ae", "Æ": "AE", "œ": "oe", "Œ": "OE", "ł": "l", "Ł": "L",
        "đ": "d", "Đ": "D", "ð": "d", "Ð": "D", "þ": "th", "Þ": "TH", "ß": "ss", "ı": "i",
        "’": "'", "‘": "'", "–": "-", "—": "-",
    }
)
_WORD_RE = re.compile(r"[a-z0-9]+")
ARTICLES = frozenset({"the", "a", "an"})


def unaccented(text: str) -> str:
    """``text`` with accents stripped and special letters transliterated, its case kept."""
    text = unicodedata.normalize("NFKD", text.translate(_TRANSLITERATION))
    return "".join(ch for ch in text if not unicodedata.combining(ch))


def fold(text: str) -> str:
    """Lower-case ASCII form of ``text``: accents stripped, special letters transliterated."""
    return unaccented(text).casefold()


def words(text: str) -> list[str]:
    """The folded words of ``text``; possessive "'s" is dropped so "Curie's" matches "Curie"."""
    return list(_words(text))


@lru_cache(maxsize=65536)
def _words(text: str) -> tuple[str, ...]:
    folded = re.sub(r"'s\b", "", fold(text))
    return tuple(_WORD_RE.findall(folded.replace("'", "")))


def normalize(text: str, drop_articles: bool = False) -> str:
    """Folded words joined by single spaces; optionally without leading/inner articles."""
    toks = words(text)
    if drop_articles:
        toks = [t for t in toks if t not in ARTICLES] or toks
    return " ".join(toks)


def contains(text: str, phrase: str) -> bool:
    """True when ``phrase`` occurs in ``text`` on word boundaries (case/accent-insensitive)."""
    return contains_any(text, (phrase,))


def contains_any(text: str, phrases) -> bool:
    """True when any of ``phrases`` occurs in ``text`` (see ``contains``)."""
    padded = " " + " ".join(_words(text)) + " "
    for phrase in phrases:
        pw = _words(phrase) if phrase else ()
        if pw and (" " + " ".join(pw) + " ") in padded:
            return True
    return False

