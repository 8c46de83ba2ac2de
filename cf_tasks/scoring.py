"""Entailment scoring of a generation against the counterfactual and the parametric answer.

Paper section 3: "counterfactual accuracy" and "parametric accuracy" measure whether the
context-based answer, or the memorised answer, is present in the model's generated output.
``score`` decides presence for both answers at once, so that the two can be told apart:

* Text is folded: case, accents (Durres = Durrës), punctuation, white space and articles do not
  matter; thousands separators are dropped, number words up to twenty become digits and "St." /
  "Mt." are "Saint" / "Mount".
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
* Fuzzy matching never turns an ordinary word into an answer: a window made of common English
  words (``COMMON_WORD_ZIPF`` or more on wordfreq's Zipf scale, about once per million words),
  none of them a word of the form, is words of its own, not a misspelling: "place" is not
  "palace", "Austin" is not "Austen" (but "Jane Austin" is "Jane Austen").
* Negation and rejection have a scope, the clause that holds the mention (a clause ends at
  punctuation other than quotes, apostrophes and hyphens, and at "but", "and", "that", "which",
  ...). A mention does not count when, in its clause,
  - a negation comes before it with at most ``NEGATION_SCOPE`` words between: "not Paris",
    "isn't Paris", "is not known to be Tolstoy", "was never written by Tolstoy" ("no" only right
    before it: "no Paris"; "not only" and "not just" are no negation);
  - "rather than", "instead of", "other than" or "as opposed to" comes right before it;
  - it is followed by a negated verb or a verdict: "Bonheur's name is not mentioned", "Paris is
    incorrect", "Paris is wrong".
  "It is not Paris, it is Lyon" therefore scores as Lyon only, and "not Paris but Lyon" too. A
  model that names an answer to reject it has not answered with it.
* A concession is overruled: a mention in a hedged clause ("often named", "commonly believed")
  that a "but" / "however" of the same sentence follows with the other answer does not count:
  "George Orwell is often named as the author, but the work was written by Ray Bradbury" is
  Bradbury only; nor does one in a hedged "although" clause ("Although programmes sometimes
  credit Puccini, ...").

``score_quote`` scores the memo-trap quote tasks, where an answer is the word that completes the
saying: the generation's first word (after quotes, punctuation and a restated instruction), or the
word right after the saying's last words anywhere in the generation ("... as strong as its weakest
link"). A word used anywhere else ("The power of a single tooth ...", 'The words "copper" and ...')
is not an answer, nor is a near-spelling of it; a negation word of the saying ("gathers no moss")
is part of the saying.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

from rapidfuzz.distance import OSA, Indel

from .text import ARTICLES, words

# The version of the rules above: bump it with every change that can move a score. It is part of
# every sweep result's settings (a bump makes the sweep rescore its stored samples) and is written
# into results JSON, sweep.csv and the dataset card.
SCORER_VERSION = 2
FUZZY_MIN_SIMILARITY = 87.0  # percent, Indel ratio; "Einstien" ~ "Einstein" is 87.5
FUZZY_MAX_EDITS = 1  # OSA edits; one more for forms of FUZZY_LONG_FORM letters or more
FUZZY_LONG_FORM = 12
FUZZY_MIN_LETTERS = 5
COMMON_WORD_ZIPF = 3.0  # wordfreq Zipf frequency: 3.0 is once per million words
NEGATION_SCOPE = 4  # words that may stand between a negation and the mention it negates
REJECTION_SCOPE = 5  # words after a mention in which a negated verb or a verdict rejects it
NEGATION_WORDS = frozenset({
    "not", "never", "nor", "neither", "nt", "cannot", "isnt", "wasnt", "arent", "werent", "dont", "doesnt",
    "didnt", "cant", "couldnt", "wont", "wouldnt", "shouldnt", "hasnt", "havent", "hadnt",
})
NEGATION_RIGHT_BEFORE = frozenset({"no"})  # "no Paris", but not "No, it is Paris" nor "no doubt it is Paris"
NOT_A_NEGATION_AFTER = frozenset({"only", "just", "merely", "simply"})  # "not only X but also Y"
REJECTION_BIGRAMS = frozenset({("rather", "than"), ("instead", "of"), ("other", "than"), ("opposed", "to")})
VERDICT_WORDS = frozenset({"incorrect", "wrong", "false", "mistaken", "inaccurate", "untrue", "mistake", "misattributed"})
AUXILIARIES = frozenset({
    "is", "was", "are", "were", "be", "been", "does", "did", "do", "has", "have", "had", "can", "could",
    "will", "would", "should", "may", "might", "must",
})
CLAUSE_WORDS = frozenset({
    "but", "and", "or", "that", "which", "who", "whom", "whose", "because", "since", "so", "although",
    "though", "while", "whereas", "however", "yet", "if", "when", "where",
})
HEDGE_WORDS = frozenset({
    "often", "commonly", "widely", "sometimes", "mistakenly", "wrongly", "popularly", "usually", "named",
    "credited", "attributed", "thought", "believed", "assumed", "considered", "claimed", "confused",
    "credit", "credits", "attribute", "cited",
})
CONCESSIVE_WORDS = frozenset({"although", "though", "while", "whereas"})
CONTRAST_WORDS = frozenset({"but", "however", "yet"})
# Sentence ends: a full stop that does not close an initial or a short abbreviation ("J. K.
# Rowling", "St. Louis", "Washington, D.C."), "!", "?" and new lines. Clause ends: those and other
# punctuation except quotes, apostrophes and hyphens.
SENTENCE_BREAK = re.compile(r"[!?\n]|(?<!\b[A-Za-z])(?<!\bSt)(?<!\bMt)(?<!\bDr)(?<!\bMr)(?<!\bJr)\.(?=\s|$)")
CLAUSE_BREAK = re.compile(r"[,;:()\[\]{}]")
NUMBER_WORDS = {
    w: str(i)
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen twenty".split()
    )
}
ABBREVIATIONS = {"st": "saint", "mt": "mount"}  # "St. Paul" is "Saint Paul"
QUOTE_TAIL = 3  # words of the saying that must come right before its ending
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
    toks = [NUMBER_WORDS.get(t, ABBREVIATIONS.get(t, t)) for t in words(text)]
    return [t for t in toks if t not in ARTICLES]


def _clause_tokens(text: str) -> tuple[list[str], list[int], list[int]]:
    """``_tokens(text)`` and, for each token, the numbers of the clause and sentence it sits in.

    Breaks are non-word characters, so the tokens are exactly ``_tokens(text)``; a clause word
    ("but", "which", ...) starts a new clause itself.
    """
    text = re.sub(r"(?<=\d)[,_](?=\d{3}\b)", "", text)
    toks: list[str] = []
    clauses: list[int] = []
    sentences: list[int] = []
    clause = 0
    for sentence, sentence_text in enumerate(SENTENCE_BREAK.split(text)):
        for part in CLAUSE_BREAK.split(sentence_text):
            for tok in _tokens(part):
                if tok in CLAUSE_WORDS:
                    clause += 1
                toks.append(tok)
                clauses.append(clause)
                sentences.append(sentence)
            clause += 1
    return toks, clauses, sentences


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
            if not _near_miss(cand, joined):
                continue
            if all(w != f and is_common_word(w) for w, f in zip(window, form)):
                continue  # words of their own, not a misspelling: "place" is not "palace"
            spans.append((i, i + n))
    return spans


@lru_cache(maxsize=65536)
def is_common_word(word: str) -> bool:
    """Whether ``word`` is a common English word (wordfreq's list of words seen at least once per
    million; names such as "Austin" or "Paris" are on it too)."""
    from wordfreq import zipf_frequency

    return zipf_frequency(word, "en", wordlist="small") >= COMMON_WORD_ZIPF


def _near_miss(candidate: str, form: str) -> bool:
    max_edits = FUZZY_MAX_EDITS + (len(form) >= FUZZY_LONG_FORM)
    return (
        candidate[:1] == form[:1]
        and OSA.distance(candidate, form, score_cutoff=max_edits) <= max_edits
        and Indel.normalized_similarity(candidate, form) * 100 >= FUZZY_MIN_SIMILARITY
    )


def _rejected(gen: list[str], clauses: list[int], start: int, end: int) -> bool:
    """Whether the mention ``gen[start:end]`` is negated or rejected within its clause."""
    clause = clauses[start]
    # Before the mention: "not (known to be) X", "rather than X", "no X".
    for i in range(start - 1, max(-1, start - 1 - NEGATION_SCOPE - 1), -1):
        if clauses[i] != clause:
            break
        tok = gen[i]
        if tok in NEGATION_WORDS and gen[i + 1] not in NOT_A_NEGATION_AFTER:
            return True
        if tok in NEGATION_RIGHT_BEFORE and i == start - 1:
            return True
        if i >= 1 and i == start - 1 and (gen[i - 1], tok) in REJECTION_BIGRAMS:
            return True
    # After the mention: "X is (not|never) ...", "X isn't ...", "X is incorrect".
    last_clause = clauses[end - 1]
    for j in range(end, min(len(gen), end + REJECTION_SCOPE)):
        if clauses[j] != last_clause:
            break
        tok = gen[j]
        if tok in VERDICT_WORDS:
            return True
        if tok in NEGATION_WORDS and (j + 1 >= len(gen) or gen[j + 1] not in NOT_A_NEGATION_AFTER):
            contracted = tok not in ("not", "never")  # "isn't", "doesn't", "cannot" carry their verb
            if contracted or gen[j - 1] in AUXILIARIES:
                return True
    return False


def _conceded(gen: list[str], clauses: list[int], sentences: list[int], span: tuple[int, int],
              others: list[tuple[int, int]]) -> bool:
    """A mention in a hedged clause that a "but" clause of its sentence overrules with the other
    answer: "Orwell is often named as the author, but the work was written by Bradbury"."""
    start, end = span
    clause, sentence = clauses[start], sentences[start]
    in_clause = [t for t, c in zip(gen, clauses) if c == clause]
    if not any(t in HEDGE_WORDS for t in in_clause):
        return False
    if in_clause[0] in CONCESSIVE_WORDS:  # "Although programmes sometimes credit Puccini, ..."
        return True
    contrast = next((k for k in range(end, len(gen)) if sentences[k] == sentence and gen[k] in CONTRAST_WORDS), None)
    return contrast is not None and any(contrast < s and sentences[s] == sentence for s, _ in others)


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
    gen, clauses, sentences = _clause_tokens(generation)
    cf_forms = _forms(counterfactual, counterfactual_aliases, person, set(_tokens(parametric)))
    pa_forms = _forms(parametric, parametric_aliases, person, set(_tokens(counterfactual)))
    cf_spans = _exact_spans(gen, cf_forms)
    pa_spans = _exact_spans(gen, pa_forms)
    cf_spans += _fuzzy_spans(gen, cf_forms, pa_forms)
    pa_spans += _fuzzy_spans(gen, pa_forms, cf_forms)
    cf_ok = [(s, e) for s, e in cf_spans if not _rejected(gen, clauses, s, e) and not _inside_longer((s, e), pa_spans)]
    pa_ok = [(s, e) for s, e in pa_spans if not _rejected(gen, clauses, s, e) and not _inside_longer((s, e), cf_spans)]
    cf_hit = any(not _conceded(gen, clauses, sentences, span, pa_ok) for span in cf_ok)
    pa_hit = any(not _conceded(gen, clauses, sentences, span, cf_ok) for span in pa_ok)
    return Outcome(counterfactual=cf_hit, parametric=pa_hit)


def _first_completion(gen: list[str], instruction: list[str]) -> int:
    """Where the continuation starts: after a restated instruction, if the generation opens with one."""
    if instruction and gen[: len(instruction)] == instruction:
        return len(instruction)
    return 0


def _plain_words(text: str) -> list[str]:
    return [NUMBER_WORDS.get(t, t) for t in words(text)]


def score_quote(generation: str, saying: str, counterfactual: str, parametric: str, instruction: str = "",
                counterfactual_aliases: Iterable[str] = (), parametric_aliases: Iterable[str] = ()) -> Outcome:
    """Which ending the generation completes ``saying`` (the saying without its last word) with.

    An ending counts when it is the generation's first word (after quotes, punctuation and a
    restated ``instruction``; an article is a first word too: "The title of a book ..." does not
    complete "Don't judge a book by its" with "title") or when it follows the saying's last
    ``QUOTE_TAIL`` words anywhere in the generation. Exact words only: no misspellings, no negation
    rule (a negation word of the saying is part of it); an ending's other remembered forms, its
    aliases ("midstream" / "mid-stream", "bold" / "brave", "valor" / "valour"), count as the ending.
    """
    plain = _plain_words(generation)
    first = plain[_first_completion(plain, _plain_words(instruction)):]
    gen = _tokens(generation)
    tail = _tokens(saying)[-QUOTE_TAIL:]
    def completes(answer: str) -> bool:
        form, folded = _plain_words(answer), _tokens(answer)
        n = len(folded)
        opens = bool(form) and first[: len(form)] == form
        return opens or (bool(folded) and any(
            gen[i : i + len(tail)] == tail and gen[i + len(tail) : i + len(tail) + n] == folded
            for i in range(len(gen) - len(tail) - n + 1)
        ))

    return Outcome(counterfactual=any(map(completes, [counterfactual, *counterfactual_aliases])),
                   parametric=any(map(completes, [parametric, *parametric_aliases])))
