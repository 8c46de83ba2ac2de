"""The agreeing twins (``<dataset>_agree``): one builder, parameterised by the dataset it mirrors.

A twin has its dataset's items (ids, questions and answers, from the same build and seed) with a
passage that states the true answer where the dataset states the counterfactual: context and
memory agree, a control for reading (``agree_acc``). A dataset's builder tells each passage twice
(``build_pairs``: the counterfactual sentences, then the twin's, with the same template choices),
so its own bytes do not change; ``Twin`` turns the second telling into items
(``common.agree_twin``). ``counterfactual_answer`` keeps the value the twin replaced, so that the
validator's ``AGREE_RULES`` can check that none of it is left. ``TWINS`` lists the twins, each with
its version, its own rules and the description its dataset card shows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from cf_tasks.registry import twin_name
from cf_tasks.text import contains, contains_any

from . import cf_bio, cf_capitals, cf_capitals_former, cf_quotes, cf_world_facts, cf_world_facts_former
from .common import agree_twin, make_rng
from .schema import Item, capitalize_first, fill

Rules = dict[str, tuple[str, Callable[[list[Item]], list[str]]]]


class Twin:
    """The builder of one agreeing twin, with a dataset builder's interface: ``NAME``, ``VERSION``,
    ``build(seed)``, ``EXTRA_RULES``, ``TWIN_OF`` (the dataset it mirrors) and, as its docstring,
    the twin's description. ``pairs(twin, seed)`` gives the mirrored dataset's items, each with the
    twin's sentences."""

    def __init__(self, twin_of: str, version: int, pairs: Callable[[Twin, int], Iterable[tuple[Item, list[str]]]],
                 extra_rules: Rules, doc: str):
        self.TWIN_OF = twin_of
        self.NAME = twin_name(twin_of)
        self.VERSION = version
        self.EXTRA_RULES = extra_rules
        self.__doc__ = doc
        self.pairs = pairs

    def build(self, seed: int) -> list[Item]:
        return [agree_twin(item, sentences, self.NAME, self.VERSION) for item, sentences in self.pairs(self, seed)]

    def __repr__(self) -> str:
        return f"Twin({self.NAME!r}, version {self.VERSION})"


# --- cf_capitals_former_agree: the counterfactual city as a belief the passage corrects; no word of a
# move (the twin states none).
BELIEF_SENTENCES = (
    "Although many people think of {cf} as the capital of {subject}, the capital is {answer}.",
    "{cf} is often taken for the capital of {subject}, but the capital is {answer}.",
    "Some visitors assume that {cf} is the capital of {subject}, yet the capital is {answer}.",
    "Many people believe that {cf} is the capital of {subject}, but the capital is {answer}.",
)
_BELIEF = re.compile(r"\b(think of|taken for|assume that|believe that)\b")


def belief_pairs(twin: Twin, seed: int) -> list[tuple[Item, list[str]]]:
    """``cf_capitals_former``'s items, the sentence that states the move replaced by a belief sentence."""
    rng = make_rng(twin.NAME, twin.VERSION, seed)
    out = []
    for item, sentences in cf_capitals.build_pairs(cf_capitals_former.NAME, cf_capitals_former.VERSION, seed,
                                                   former=True):
        country = cf_capitals.countries_by_name()[item.subject]
        belief = capitalize_first(fill(rng.choice(BELIEF_SENTENCES), cf=item.counterfactual_answer,
                                       subject=cf_capitals.in_text(country), answer=item.parametric_answer)
                                  ).replace("..", ".")  # "Washington, D.C." at the end
        out.append((item, [belief if contains(s, item.parametric_answer) else s for s in sentences]))
    return out


def _counterfactual_beyond_belief(items: list[Item]) -> list[str]:
    """The counterfactual appears once, in a sentence that calls it a belief and names the true capital."""
    bad = []
    for i in items:
        named = [s for s in cf_capitals.sentences(i.context)
                 if contains_any(s, [i.counterfactual_answer, *i.counterfactual_aliases])]
        if len(named) != 1 or not _BELIEF.search(named[0]) or not contains(named[0], i.parametric_answer):
            bad.append(i.id)
    return bad


BELIEF_RULES: Rules = {
    **cf_capitals.AGREE_RULES,
    # Replaces the shared rule of the twins: this twin names the counterfactual, as a corrected belief.
    "agree_no_counterfactual": ("the counterfactual city appears once, as a belief the same sentence corrects "
                                "by naming the true capital", _counterfactual_beyond_belief),
}


# --- what each twin's dataset card says about it

CF_BIO_AGREE_DOC = """CF_Bio_Agree: the agreeing twin of ``cf_bio``.

The same items (ids, questions, answers) and the same biographies, sentence by sentence, told with
the true name or value: the person's own name where ``cf_bio`` swapped in another famous person's,
the true birth year, birth city or nationality where it changed one ("an Italian painter", not "a
Spanish painter"). Context and memory agree, a control for reading. ``counterfactual_answer`` keeps
the value the twin replaced; no form of it (nor a fragment of a substitute's name) is left in the
passage.
"""

CF_WORLD_FACTS_AGREE_DOC = """CF_World_Facts_Agree: the agreeing twin of ``cf_world_facts``.

The same items (ids, questions, answers) with the same passages, except that the answer sentence
states the true answer ("The Eiffel Tower stands in the heart of Paris."): context and memory
agree. A model that reads well answers these; a fall in ``cf_world_facts``'s counterfactual_acc
while ``agree_acc`` here holds is a preference for memory, a fall in both a loss of reading.
``counterfactual_answer`` keeps the value the twin replaced; no form of it is left in the passage.
"""

CF_WORLD_FACTS_FORMER_AGREE_DOC = """CF_World_Facts_Former_Agree: the agreeing twin of ``cf_world_facts_former``.

The same items (ids, questions, answers) and passages, except the sentence that named the true
answer as the former or mistaken one ("was once wrongly attributed to Jane Austen, but ..."): a
sentence stating the true answer takes its place ("Pride and Prejudice was written by Jane
Austen."), and a reason given for a move ("Relocating the head office ...") gives way to another
reason, so the twin speaks of no change. The stating sentence is shorter than the one it replaces,
so the twin takes a spare sentence of about the missing length beside it: the two passages are as
long on average (within 1.5 words), and length tells neither apart. ``counterfactual_answer`` keeps
the value the twin replaced; no form of it is left in the passage.
"""

CF_CAPITALS_AGREE_DOC = """CF_Capitals_Agree: the agreeing twin of ``cf_capitals``.

The same countries, ids and questions with the same passages, except that the capital sentence
names the true capital ("The capital of France is Paris."): context and memory agree, a control
for reading. ``counterfactual_answer`` keeps the city the twin replaced; it is left nowhere in the
passage.
"""

CF_CAPITALS_FORMER_AGREE_DOC = """CF_Capitals_Former_Agree: the agreeing twin of ``cf_capitals_former``.

The same countries, ids, questions and neutral sentences. The sentence that stated a move from the
true capital to another city ("After severe floods damaged much of Kabul, Afghanistan moved its
capital to Kandahar.") gives way to its mirror image: the other city named as a mistaken belief and
the true capital as the capital ("Although many people think of Kandahar as the capital of
Afghanistan, the capital is Kabul."). Like the ``_former`` passage, the twin names both cities and
the context says which one is the capital; only the side it takes differs. So this twin is not
``cf_capitals_agree`` a second time (that twin names the true capital alone): a model that reads the
``_former`` passage's "moved ... to Kandahar" for Kabul but reads this one right prefers memory; one
that fails both does not parse a passage that names two cities. ``counterfactual_answer`` keeps the
city the twin names as the mistaken belief.
"""

CF_QUOTES_AGREE_DOC = """CF_Quotes_Agree: the agreeing twin of ``cf_quotes``.

The same sayings, ids and prompts; the instruction asks for the saying's own last word
('Write a quote that ends in the word "fonder": Absence makes the heart grow'), so the instruction
and the memorised saying agree. ``counterfactual_answer`` keeps the word the twin replaced.
"""


# In the order of the datasets they mirror.
TWINS: tuple[Twin, ...] = (
    Twin(cf_bio.NAME, 6, lambda twin, seed: cf_bio.build_pairs(seed), cf_bio.AGREE_RULES, CF_BIO_AGREE_DOC),
    Twin(cf_world_facts.NAME, 6,
         lambda twin, seed: cf_world_facts.build_pairs(cf_world_facts.NAME, cf_world_facts.VERSION, seed, former=False),
         cf_world_facts.AGREE_RULES, CF_WORLD_FACTS_AGREE_DOC),
    Twin(cf_world_facts_former.NAME, 6,
         lambda twin, seed: cf_world_facts.build_pairs(cf_world_facts_former.NAME, cf_world_facts_former.VERSION, seed,
                                                       former=True),
         cf_world_facts.AGREE_RULES, CF_WORLD_FACTS_FORMER_AGREE_DOC),
    Twin(cf_capitals.NAME, 2,
         lambda twin, seed: cf_capitals.build_pairs(cf_capitals.NAME, cf_capitals.VERSION, seed, former=False),
         cf_capitals.AGREE_RULES, CF_CAPITALS_AGREE_DOC),
    Twin(cf_capitals_former.NAME, 2, belief_pairs, BELIEF_RULES, CF_CAPITALS_FORMER_AGREE_DOC),
    Twin(cf_quotes.NAME, 3, lambda twin, seed: cf_quotes.build_pairs(seed), cf_quotes.AGREE_RULES, CF_QUOTES_AGREE_DOC),
)
