"""Entailment scoring of a generation against the counterfactual and the parametric answer.

Paper section 3: "counterfactual accuracy" and "parametric accuracy" measure whether the
context-based answer, or the memorised answer, is present in the model's generated output.
``score`` decides presence for both answers at once, so that the two can be told apart:

* Text is folded: case, accents (Durres = Durrës), punctuation, white space and articles do not
  matter; thousands separators are dropped and number words up to twenty become digits.
* A form matches on word boundaries only: "USA" is not in "usage", "Mississippi" is not in
  "Mississippian".
* Each answer may have aliases. With ``person=True`` the surname (last name word) is also
  accepted, unless the other answer shares it.
* Tokens the two answers share never decide alone: a match of one answer that lies inside a
  longer match of the other ("New York" inside "New York City") does not count.
* Small misspellings count. A window of the generation matches a form of 5 or more letters when
  it starts with the same letter, is at most ``FUZZY_MAX_EDITS`` edits away (rapidfuzz OSA
  distance: insert, delete, substitute or swap two neighbours; 2 edits for forms of 12+ letters)
  and at least ``FUZZY_MIN_SIMILARITY`` percent similar (rapidfuzz Indel ratio). "Mississipi",
  "Sweeden" and "Einstien" match; "Austria" / "Australia", "Iceland" / "Ireland" and
  "Gambia" / "Zambia" do not. A window that is a prefix or extension of the form (a derived word,
  not a typo), or an exact form of the other answer, never matches fuzzily; nor do numbers.
* Negation: a mention directly preceded by a negation cue ("not Paris", "isn't Paris",
  "rather than Paris", "instead of Paris") does not count as giving that answer. "It is not
  Paris, it is Lyon" therefore scores as Lyon only. A model that names an answer to reject it
  has not answered with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from rapidfuzz.distance import OSA, Indel

from .text import ARTICLES, words

FUZZY_MIN_SIMILARITY = 87.0  # percent, Indel ratio; "Einstien" ~ "Einstein" is 87.5
FUZZY_MAX_EDITS = 1  # OSA edits; one more for forms of FUZZY_LONG_FORM letters or more
FUZZY_LONG_FORM = 12
FUZZY_MIN_LETTERS = 5
NEGATION_WINDOW = 2  # words before a mention that may negate it
NEGATION_WORDS = frozenset({"not", "never", "no", "nor", "isnt", "wasnt", "arent", "werent", "neither", "nt"})
NEGATION_BIGRAMS = frozenset({("rather", "than"), ("instead", "of"), ("other", "than")})
NUMBER_WORDS = {
    w: str(i)
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen twenty".split()
    )
}
LABELS = ("context", "parametric", "both", "neither")


@dataclass(frozen=True)
class Outcome:
    counterfactual: bool
    parametric: bool

    @property
    def label(self) -> str:
        if self.counterfactual and self.parametric:
            return "both"
        if self.counterfactual:
            return "context"
        return "parametric" if self.parametric else "neither"


def _tokens(text: str) -> list[str]:
    text = re.sub(r"(?<=\d)[,_](?=\d{3}\b)", "", text)
    toks = [NUMBER_WORDS.get(t, t) for t in words(text)]
    return [t for t in toks if t not in ARTICLES]


def _forms(answer: str, aliases: Iterable[str], person: bool, other_tokens: set[str]) -> list[list[str]]:
    forms = [_tokens(answer), *(_tokens(a) for a in aliases)]
    if person and len(forms[0]) > 1 and forms[0][-1] not in other_tokens:
        forms.append([forms[0][-1]])
    unique: list[list[str]] = []
    for f in forms:
        if f and f not in unique:
            unique.append(f)
    return unique


def _exact_spans(gen: list[str], forms: list[list[str]]) -> list[tuple[int, int]]:
    spans = []
    for form in forms:
        n = len(form)
        for i in range(len(gen) - n + 1):
            if gen[i : i + n] == form:
                spans.append((i, i + n))
    return spans


def _fuzzy_spans(gen: list[str], forms: list[list[str]], other_forms: list[list[str]]) -> list[tuple[int, int]]:
    spans = []
    for form in forms:
        joined = " ".join(form)
        if len(joined.replace(" ", "")) < FUZZY_MIN_LETTERS or any(t.isdigit() for t in form):
            continue
        n = len(form)
        for i in range(len(gen) - n + 1):
            window = gen[i : i + n]
            cand = " ".join(window)
            if cand == joined or window in other_forms or any(t.isdigit() for t in window):
                continue
            if cand.startswith(joined) or joined.startswith(cand):
                continue
            if _near_miss(cand, joined):
                spans.append((i, i + n))
    return spans


def _near_miss(candidate: str, form: str) -> bool:
    max_edits = FUZZY_MAX_EDITS + (len(form) >= FUZZY_LONG_FORM)
    return (
        candidate[:1] == form[:1]
        and OSA.distance(candidate, form, score_cutoff=max_edits) <= max_edits
        and Indel.normalized_similarity(candidate, form) * 100 >= FUZZY_MIN_SIMILARITY
    )


def _negated(gen: list[str], start: int) -> bool:
    before = gen[max(0, start - NEGATION_WINDOW) : start]
    if any(t in NEGATION_WORDS for t in before):
        return True
    return len(before) == 2 and tuple(before) in NEGATION_BIGRAMS


def _inside_longer(span: tuple[int, int], others: list[tuple[int, int]]) -> bool:
    s, e = span
    return any(os <= s and e <= oe and (oe - os) > (e - s) for os, oe in others)


def score(
    generation: str,
    counterfactual: str,
    parametric: str,
    counterfactual_aliases: Iterable[str] = (),
    parametric_aliases: Iterable[str] = (),
    person: bool = False,
) -> Outcome:
    """Which of the two answers the generation states (see the module docstring for the rules)."""
    gen = _tokens(generation)
    cf_forms = _forms(counterfactual, counterfactual_aliases, person, set(_tokens(parametric)))
    pa_forms = _forms(parametric, parametric_aliases, person, set(_tokens(counterfactual)))
    cf_spans = _exact_spans(gen, cf_forms)
    pa_spans = _exact_spans(gen, pa_forms)
    cf_spans += _fuzzy_spans(gen, cf_forms, pa_forms)
    pa_spans += _fuzzy_spans(gen, pa_forms, cf_forms)
    cf_hit = any(not _negated(gen, s) and not _inside_longer((s, e), pa_spans) for s, e in cf_spans)
    pa_hit = any(not _negated(gen, s) and not _inside_longer((s, e), cf_spans) for s, e in pa_spans)
    return Outcome(counterfactual=cf_hit, parametric=pa_hit)
