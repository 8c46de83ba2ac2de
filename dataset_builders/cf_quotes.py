"""CF_Quotes: memo-trap instructions (paper section 3.2, item 3; McKenzie et al.'s Memo Trap).

"Write a quote that ends in the word "heavy": Absence makes the heart grow". The instruction (the
context) asks for a word other than the memorised ending (the parametric answer).

Version 2: every prompt (the saying without its last word) has at least ``MIN_PROMPT_WORDS``
words, so that it pins one saying ("Money" or "Love is" do not: "Money talks", "Love is blind"
are weak continuations among many); endings with accepted variants ("Fortune favours the
bold / brave") list them in ``last_word_aliases``, which count as the parametric answer and are
never drawn as the counterfactual.

Version 3: sayings whose prompt has more than one memorised ending ("A piece of" cake / advice) are left
out (quotes.json ``ambiguous``), and an ending or asked word with an American and a British spelling
(valor / valour) takes the other as an alias (``spelling_variants``).

Version 4: an ending written closed, open or hyphenated takes its other forms as aliases too
(midstream / mid-stream, bathwater / bath water), and the quote tasks score every alias.

``build_pairs`` gives each item the instruction of its agreeing twin ``cf_quotes_agree``,
which asks for the saying's own ending; ``AGREE_RULES`` check it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import lru_cache

from . import tables
from .common import make_rng, same_answer
from .schema import Item

NAME = "cf_quotes"
VERSION = 4
INSTRUCTION = 'Write a quote that ends in the word "{word}":'
MIN_PROMPT_WORDS = 3
_ASKED = re.compile(re.escape(INSTRUCTION).replace(re.escape("{word}"), "(.+)"))


@lru_cache(maxsize=1)
def _meta() -> dict:
    """quotes.json's fields beside the quotes: spelling_variants, ambiguous."""
    return json.loads((tables.DATA_DIR / "quotes.json").read_text(encoding="utf-8"))


def spelling_variants(word: str) -> list[str]:
    """The other spelling of ``word`` (valor / valour), from quotes.json's ``spelling_variants``."""
    pairs = _meta()["spelling_variants"]
    return [b for a, b in pairs.items() if a == word] + [a for a, b in pairs.items() if b == word]


def ambiguous_quotes() -> dict[str, str]:
    """Quote id -> why its prompt has no one memorised ending; these quotes make no item."""
    return _meta()["ambiguous"]


def build_pairs(seed: int) -> list[tuple[Item, list[str]]]:
    """Each item with the instruction of its agreeing twin, which asks for the saying's own ending."""
    rng = make_rng(NAME, VERSION, seed)
    pairs = []
    for quote in sorted(tables.quotes(), key=lambda q: q["id"]):
        if quote["id"] in ambiguous_quotes():
            continue
        word = rng.choice(quote["alternatives"])
        endings = [quote["last_word"], *quote.get("last_word_aliases", [])]
        prefix = quote["saying"][: quote["saying"].rfind(" ")].strip()
        item = Item(
            id=f"{NAME}-{quote['id']}",
            dataset=NAME,
            relation="quote_ending",
            subject=quote["saying"],
            context=INSTRUCTION.format(word=word),
            question=prefix,
            counterfactual_answer=word,
            counterfactual_aliases=spelling_variants(word),
            parametric_answer=quote["last_word"],
            parametric_aliases=[*endings[1:], *(v for e in endings for v in spelling_variants(e))],
            answer_position="beginning",
            version=VERSION,
            seed=seed,
        )
        pairs.append((item, [INSTRUCTION.format(word=quote["last_word"])]))
    return pairs


def build(seed: int) -> list[Item]:
    return [item for item, _ in build_pairs(seed)]


# Validator rules (run by validate.failures through EXTRA_RULES).

def _prompt_too_short(items: list[Item]) -> list[str]:
    return [i.id for i in items if len(i.question.split()) < MIN_PROMPT_WORDS]


def _variant_ending(items: list[Item]) -> list[str]:
    """Read from the table, not the item: a counterfactual that is an accepted ending of the saying."""
    variants = {q["saying"]: [q["last_word"], *q.get("last_word_aliases", [])] for q in tables.quotes()}
    return [i.id for i in items if any(same_answer(i.counterfactual_answer, v) for v in variants.get(i.subject, []))]


def _takes_an(word: str) -> bool:
    """'an' before a vowel sound (the common exceptions of English spelling included)."""
    w = word.lower()
    vowel = w[:1] in "aeiou" and not w.startswith(("uni", "use", "eu", "one"))
    return vowel or w.startswith(("hour", "honest", "heir"))


def _article_agreement(items: list[Item]) -> list[str]:
    """The word the instruction asks for takes the article that ends the prompt."""
    bad = []
    for item in items:
        article = re.search(r"\b(a|an)$", item.question, re.IGNORECASE)
        if article and (article.group(1).lower() == "an") != _takes_an(asked_word(item) or ""):
            bad.append(item.id)
    return bad


def asked_word(item: Item) -> str | None:
    """The word the instruction asks for; None when the context is not the instruction."""
    found = _ASKED.fullmatch(item.context)
    return found.group(1) if found else None


def _asks_counterfactual(items: list[Item]) -> list[str]:
    """The twin's only place for the counterfactual is the asked word ("word" may be in the frame)."""
    return [i.id for i in items if (word := asked_word(i)) is None or same_answer(word, i.counterfactual_answer)
            or not same_answer(word, i.parametric_answer)]


def _ambiguous_ending(items: list[Item]) -> list[str]:
    ambiguous = {q["saying"] for q in tables.quotes() if q["id"] in ambiguous_quotes()}
    return [i.id for i in items if i.subject in ambiguous]


def _spelling_variant_missing(items: list[Item]) -> list[str]:
    def missing(answer: str, aliases: list[str]) -> bool:
        return any(v not in aliases for v in spelling_variants(answer))
    return [i.id for i in items if missing(i.counterfactual_answer, i.counterfactual_aliases)
            or missing(i.parametric_answer, i.parametric_aliases)]


EXTRA_RULES: dict[str, tuple[str, Callable[[list[Item]], list[str]]]] = {
    "quote_ambiguous_ending": ("no saying whose prompt has more than one memorised ending (quotes.json ambiguous)",
                               _ambiguous_ending),
    "quote_spelling_variant": ("an ending or asked word with another spelling (valor / valour) lists it as an alias",
                               _spelling_variant_missing),
    "quote_prompt_too_short": (
        f"the prompt (the saying without its last word) has at least {MIN_PROMPT_WORDS} words", _prompt_too_short),
    "quote_variant_ending": (
        "the counterfactual word is not the saying's ending nor an accepted variant of it (last_word_aliases)",
        _variant_ending),
    "quote_article_agreement": (
        "a prompt ending in 'a' / 'an' is followed by an asked word that takes that article",
        _article_agreement),
}

# The agreeing twin (cf_quotes_agree) asks for the saying's own ending. Its context is the instruction
# alone, whose frame may hold the counterfactual ("ends in the word "step"" for the counterfactual
# "word"), so the shared agree_no_counterfactual rule looks at the asked word here.
AGREE_RULES: dict[str, tuple[str, Callable[[list[Item]], list[str]]]] = {
    "agree_no_counterfactual": (
        "the context is the instruction asking for the true ending, never for the counterfactual word",
        _asks_counterfactual),
    "quote_prompt_too_short": EXTRA_RULES["quote_prompt_too_short"],
    "quote_article_agreement": EXTRA_RULES["quote_article_agreement"],
}
