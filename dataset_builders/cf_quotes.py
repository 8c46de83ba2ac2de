"""CF_Quotes: memo-trap instructions (paper section 3.2, item 3; McKenzie et al.'s Memo Trap).

"Write a quote that ends in the word "heavy": Absence makes the heart grow". The instruction (the
context) asks for a word other than the memorised ending (the parametric answer).
"""

from __future__ import annotations

from . import tables
from .common import make_rng
from .schema import Item

NAME = "cf_quotes"
VERSION = 1
INSTRUCTION = 'Write a quote that ends in the word "{word}":'


def build(seed: int) -> list[Item]:
    rng = make_rng(NAME, VERSION, seed)
    items = []
    for quote in sorted(tables.quotes(), key=lambda q: q["id"]):
        word = rng.choice(quote["alternatives"])
        prefix = quote["saying"][: quote["saying"].rfind(" ")].strip()
        items.append(
            Item(
                id=f"{NAME}-{quote['id']}",
                dataset=NAME,
                relation="quote_ending",
                subject=quote["saying"],
                context=INSTRUCTION.format(word=word),
                question=prefix,
                counterfactual_answer=word,
                parametric_answer=quote["last_word"],
                answer_position="beginning",
                version=VERSION,
                seed=seed,
            )
        )
    return items
