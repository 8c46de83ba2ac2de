"""CF_World_Facts: coherent counterfactual passages about world facts (paper section 3.2, item 2).

Each fact of ``data/relations.json`` gets a passage of 5-9 sentences, written like a short article
(``article_from_templates``: an introduction; for a book, invention, piece of music, museum's
painting or company (the relations marked ``described``), what it is and two documented details from
``data/about.json`` (a further one ends the passage); its history; how it is seen), that states another answer of the same
relation. The paper notes that generated counterfactual contexts put the answer first too often,
so the sentence carrying the answer is placed at the beginning, middle or end in equal
shares, and the position is recorded per item.

The counterfactual is plausible by construction, from fields of the table (one home per fact):

- creators (authors, inventors, painters, composers) were alive and at least ``MIN_CREATOR_AGE`` in
  the ``year`` of the work; lifespans come from ``people.json`` or the relation's ``creators`` table;
- a river's counterfactual mouth is a water body of the river's ``region``; landmarks, mountains
  and headquarters keep to the ``regions`` group of their true answer (for headquarters, the company's
  country: no company moves abroad);
- a counterfactual is never also true: never a water body that contains the true one or lies in it
  (``within``; the containers count as true aliases, except those that contain the counterfactual too,
  which the context implies), never a city of the same ``metro_areas``;
- a subject whose name places it or names its maker (India Gate, the AK-47: ``name_implies_answer``)
  gets no counterfactual, and every answer sentence states the answer rather than implying it;
- nothing in the passage argues against the counterfactual (``cues``): a substitute author or
  composer writes in the work's form and shares a culture its title, characters and description fit
  (no novel about Raskolnikov by a poet, no jazz for Elgar); a substitute landmark city or mountain
  country speaks a language of the subject's name (the Arc de Triomphe goes to Brussels, not
  Vienna); no sentence presumes what the subject's fact or description denies (the Analytical Engine,
  never fully built, gets no "later improvements"; the Liberty Bell, shown indoors, no sunset).

Facts left without a candidate are dropped. Items whose context names the true answer ("moved its
headquarters from Cupertino to Seattle") are the ``cf_world_facts_former`` dataset (``build_items``
with ``former=True``); this dataset holds only items that do not name it, and no sentence of those
speaks of a change (``EXTRA_RULES``).

``build_pairs`` gives each item the sentences of its agreeing twin (``cf_world_facts_agree``,
``cf_world_facts_former_agree``): the same passage stating the true answer, checked by
``AGREE_RULES``; the twin of a ``_former`` passage is as long as the passage (``length_matched_twin``).
"""

from __future__ import annotations

import random
import re
from functools import lru_cache

from cf_tasks.registry import twin_name
from cf_tasks.text import contains_any, words

from . import cues, tables
from .common import POSITIONS, article_from_templates, balanced, make_rng, passage_from_templates, same_answer, slug
from .schema import Item, answer_position, fill

NAME = "cf_world_facts"
VERSION = 7
ITEMS_PER_FACT = 3  # distinct counterfactuals per fact (fewer where fewer candidates exist)
FORMER_ITEMS_PER_FACT = 1
MIN_CREATOR_AGE = 20


def counterfactual_choices(fact: dict, answers: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """Other answers of the relation that differ from the true one and are not in the subject."""
    true_forms = [fact["answer"], *fact.get("answer_aliases", [])]
    return [
        (answer, aliases)
        for answer, aliases in answers
        if not any(same_answer(a, t) for a in [answer, *aliases] for t in true_forms)
        and not contains_any(fact["subject"], [answer, *aliases])
    ]


def build_passage_items(
    dataset: str,
    version: int,
    templates: dict,
    facts: list[dict],
    seed: int,
    rng: random.Random,
    items_per_fact: int,
    mentions_share: float,
) -> list[tuple[Item, list[str]]]:
    """Items for the facts of one relation, with balanced answer positions, each with the sentences
    of its agreeing twin: an article (``article_from_templates``, with the fact's ``about`` sentences
    after its opening) where ``templates`` has a ``kind``, else a shuffled passage (``passage_from_templates``).

    A fact may carry its own ``cf_pool`` of (answer, aliases) to draw the counterfactual from
    (default: the other answers of the relation; an empty pool drops the fact) and extra template
    ``values``. The items of one fact get distinct counterfactuals, so a fact with fewer candidates
    than ``items_per_fact`` gets fewer items.
    """
    answers = sorted({(f["answer"], tuple(f.get("answer_aliases", []))) for f in facts})
    choices = {}
    for i, fact in enumerate(facts):
        pool = fact["cf_pool"] if "cf_pool" in fact else [(a, list(al)) for a, al in answers]
        choices[i] = counterfactual_choices(fact, pool)
    slots = [(i, k) for i in range(len(facts)) for k in range(min(items_per_fact, len(choices[i])))]
    positions = balanced(POSITIONS, len(slots), rng)
    n_mentions = round(mentions_share * len(slots))
    mentions = balanced([True] * n_mentions + [False] * (len(slots) - n_mentions), len(slots), rng)
    # The twins' own draws, so that the counterfactual items stay what they were without twins.
    agree_rng = make_rng(f"{twin_name(dataset)}:{templates['relation']}", version, seed)
    items = []
    for (i, k), position, mention in zip(slots, positions, mentions):
        fact = facts[i]
        cf_answer, cf_aliases = choices[i].pop(rng.randrange(len(choices[i])))
        # A container of the true answer that also contains the counterfactual (the Atlantic, for the
        # English Channel against the North Sea) is implied by the context: it is no true answer here.
        shared = fact.get("shared_containers", {}).get(cf_answer, [])
        true_aliases = [a for a in fact.get("answer_aliases", []) if a not in shared]
        parametric = [fact["answer"], *true_aliases]
        values = {"subject": fact["subject"], "answer": cf_answer, "parametric": fact["answer"],
                  **fact.get("values", {})}
        args = (templates, values, cf_answer, [] if mention else parametric, position, mention, rng, agree_rng)
        if "kind" in templates:
            # no sentence that is false of the subject (cues.contradicted_templates), in any pool
            own = {**templates, **{pool: [t for t in templates[pool] if t not in fact.get("contradicted", ())]
                                   for pool in cues.TEMPLATE_POOLS if pool in templates}}
            args = (own, *args[1:])
            passage = article_from_templates(*args, about=fact["about"])
        else:
            passage = passage_from_templates(*args)
        # an answer that ends a sentence with its own full stop ("Washington, D.C.") takes no second one
        if "kind" in templates:
            passage = passage._replace(sentences=[_one_stop(s) for s in passage.sentences],
                                       agree=[_one_stop(s) for s in passage.agree])
        agree = passage.agree
        if mention and "kind" in templates:  # the world-facts articles (cf_capitals keeps its twins)
            agree = length_matched_twin(passage, own, values, [cf_answer, *parametric], parametric, agree_rng)
        item = Item(
            id=f"{dataset}-{templates['relation']}-{slug(fact['subject'])}-{k}",
            dataset=dataset,
            relation=templates["relation"],
            subject=fact["subject"],
            context=" ".join(passage.sentences),
            question=fill(templates["question"], **values),
            counterfactual_answer=cf_answer,
            counterfactual_aliases=list(cf_aliases),
            parametric_answer=fact["answer"],
            parametric_aliases=true_aliases,
            answer_position=answer_position(passage.sentences, cf_answer),
            mentions_parametric=mention,
            version=version,
            seed=seed,
        )
        items.append((item, agree))
    return items


def _one_stop(sentence: str) -> str:
    return sentence[:-1] if sentence.endswith("..") else sentence


LENGTH_SLACK = 2  # words: a spare filler within this of the gap may close it


def length_matched_twin(passage, templates: dict, values: dict, forbidden: list[str], truth: list[str],
                        agree_rng: random.Random) -> list[str]:
    """The twin of a ``_former`` passage, as long as the passage: the sentence that names both answers is
    longer than the twin's answer sentence, so the twin gets a spare filler of about the missing length
    (beside its answer sentence, which keeps its position), where one fits. Without it the ``_former``
    passage would be 8 words longer on average, a cue that tells the two apart."""
    agree = list(passage.agree)
    gap = len(" ".join(passage.sentences).split()) - len(" ".join(agree).split())
    used = [s.strip().rstrip(".") for s in [*passage.sentences, *agree]]
    spare = [fill(t, **values) for t in templates["filler_sentences"]
             if not any(cues.template_pattern(t).fullmatch(u) for u in used)]  # "It ..." is the same filler
    spare = [s for s in spare if not contains_any(s, forbidden)]
    close = [s for s in spare if abs(len(s.split()) - gap) <= LENGTH_SLACK]
    if gap <= LENGTH_SLACK or not close:
        return agree
    extra = close[agree_rng.randrange(len(close))]
    answer_at = next((n for n, s in enumerate(agree) if contains_any(s, truth)), len(agree) - 1)
    agree.insert(answer_at if answer_at == len(agree) - 1 else answer_at + 1, extra)
    return agree


# --- plausibility, from the tables ----------------------------------------------------------------


def number_values(plural: bool) -> dict[str, str]:
    """Verb and pronoun forms that agree with the subject ("The Spanish Steps are"; ``{them}`` is the object:
    "have never seen them")."""
    if plural:
        return {"is": "are", "was": "were", "has": "have", "s": "", "it": "they", "its": "their", "them": "them"}
    return {"is": "is", "was": "was", "has": "has", "s": "s", "it": "it", "its": "its", "them": "it"}


@lru_cache(maxsize=None)
def lifespans(relation: str) -> dict[str, tuple[int, int | None]]:
    """Creator -> (birth year, death year or None): people.json first, else the relation's ``creators``."""
    record = relations_by_name()[relation]
    people = {}
    for p in tables.people():
        for name in {p["name"], *p["aliases"]}:
            people.setdefault(name, set()).add((p["birth_year"], p["death_year"]))
    out = {}
    # the true creators, and those only ever drawn as a counterfactual (other_answers)
    names = [*sorted({f["answer"] for f in record["facts"]}), *(a["answer"] for a in record.get("other_answers", []))]
    for name in names:
        found = people.get(name, set())
        own = record["creators"].get(name)
        if len(found) + bool(own) != 1:
            raise ValueError(f"relations.json {relation}: {name!r} needs a lifespan in exactly one place "
                             f"(people.json or the relation's creators table)")
        out[name] = next(iter(found)) if found else (own["birth_year"], own["death_year"])
    return out


def active_in(span: tuple[int, int | None] | None, year: int | None) -> bool:
    """Alive and at least ``MIN_CREATOR_AGE`` years old in ``year``."""
    if span is None or year is None:
        return False
    birth, death = span
    return year - birth >= MIN_CREATOR_AGE and (death is None or death >= year)


def containers(record: dict, answer: str) -> list[str]:
    """Every larger place or water body that ``answer`` lies in (``within``, followed transitively)."""
    within = {k.casefold(): v for k, v in record.get("within", {}).items()}
    out, todo = [], [answer]
    while todo:
        for outer in within.get(todo.pop().casefold(), []):
            if outer not in out:
                out.append(outer)
                todo.append(outer)
    return out


def also_true(record: dict, truth: str, cf_forms: list[str]) -> bool:
    """True when the counterfactual would not contradict the truth: it lies in or contains the true
    answer (``within``), or shares its metropolitan area (``metro_areas``)."""
    if any(same_answer(truth, c) for c in containers(record, cf_forms[0])):
        return True
    related = containers(record, truth) + record.get("name_clashes", {}).get(truth, [])
    related += [city for area in record.get("metro_areas", {}).values()
                if any(same_answer(truth, c) for c in area) for city in area if not same_answer(city, truth)]
    return any(same_answer(f, r) for f in cf_forms for r in related)


def region_of(record: dict, fact: dict) -> list[str] | None:
    """The answers a fact's counterfactual may be drawn from (None: the relation has no regions)."""
    regions = record.get("regions")
    if not regions:
        return None
    if "region" in fact:
        return regions[fact["region"]]
    return next((group for group in regions.values() if any(same_answer(fact["answer"], a) for a in group)), [])


def work_year(fact: dict) -> int | None:
    """The year of a work: its own ``year``, else that of the same work in another relation (one home:
    the Mona Lisa's year sits with painting_painter, painting_museum reads it)."""
    if fact.get("year") is not None:
        return fact["year"]
    return next((f["year"] for (_, subject), f in facts_by_subject().items()
                 if subject == fact["subject"] and f.get("year") is not None), None)


def collects(record: dict, museum: str, year: int | None) -> bool:
    """The museum's ``collections`` span (null: open) holds art of ``year``."""
    span = record["collections"].get(museum)
    return span is not None and year is not None and (span[0] is None or span[0] <= year) and (
        span[1] is None or year <= span[1])


def plausible(record: dict, fact: dict, cf: str, cf_aliases: list[str]) -> bool:
    region = region_of(record, fact)
    if region is not None and not any(same_answer(cf, a) for a in region):
        return False
    if "creators" in record and not active_in(lifespans(record["relation"]).get(cf), work_year(fact)):
        return False
    if "collections" in record and not collects(record, cf, work_year(fact)):
        return False
    if not cues.creator_fits(record, fact, cf) or not cues.speaks_name(record, fact, cf):
        return False
    return not also_true(record, fact["answer"], [cf, *cf_aliases])


@lru_cache(maxsize=1)
def relations_by_name() -> dict[str, dict]:
    return {r["relation"]: r for r in tables.relations()}


@lru_cache(maxsize=1)
def facts_by_subject() -> dict[tuple[str, str], dict]:
    return {(r["relation"], f["subject"]): f for r in tables.relations() for f in r["facts"]}


def answer_pool(record: dict) -> list[tuple[str, list[str]]]:
    pool = {f["answer"]: list(f.get("answer_aliases", [])) for f in record["facts"]}
    pool.update({a["answer"]: list(a["answer_aliases"]) for a in record.get("other_answers", [])})
    return sorted(pool.items())


def prepared_facts(record: dict) -> list[dict]:
    """The relation's facts with their plausible ``cf_pool``, containers as true aliases, and the
    number forms of the subject."""
    problems = cues.presumes_problems(record)
    if problems:
        raise ValueError(problems[0])
    pool = answer_pool(record)
    forms = dict(pool)
    out = []
    for fact in record["facts"]:
        outer = containers(record, fact["answer"])
        aliases = [*fact.get("answer_aliases", []), *outer,
                   *(al for a, als in pool if a in outer for al in als)]
        shared = {a: [form for c in containers(record, a) if c in outer for form in (c, *forms.get(c, []))]
                  for a, _ in pool}
        out.append({
            **fact,
            "answer_aliases": aliases,
            # A name that places the subject (Westminster Abbey, the Hollywood Sign) contradicts any
            # other answer: an empty pool drops the fact.
            "cf_pool": [] if fact.get("name_implies_answer") else [
                (a, al) for a, al in pool if plausible(record, fact, a, al)],
            "values": number_values(fact.get("plural", False)),
            "about": tables.about().get(fact["subject"], []) if record.get("described") else [],
            "shared_containers": {a: forms for a, forms in shared.items() if forms},
            "contradicted": sorted(cues.contradicted_templates(record, fact["subject"])),
        })
    return out


def build_pairs(dataset: str, version: int, seed: int, former: bool) -> list[tuple[Item, list[str]]]:
    """The items of every relation, each with the sentences of its agreeing twin; ``former``: every
    context names the true answer as the former one."""
    rng = make_rng(dataset, version, seed)
    per_fact = FORMER_ITEMS_PER_FACT if former else ITEMS_PER_FACT
    pairs: list[tuple[Item, list[str]]] = []
    for record in sorted(tables.relations(), key=lambda r: r["relation"]):
        pairs += build_passage_items(dataset, version, record, prepared_facts(record), seed, rng, per_fact,
                                     float(former))
    return pairs


def build_items(dataset: str, version: int, seed: int, former: bool) -> list[Item]:
    """The counterfactual items of ``build_pairs``."""
    return [item for item, _ in build_pairs(dataset, version, seed, former)]


def build(seed: int) -> list[Item]:
    return build_items(NAME, VERSION, seed, former=False)


# --- validator rules (shared with cf_world_facts_former) ------------------------------------------

# Words that speak of a change of the answer (or of a belief about it).
CHANGE_WORDS = re.compile(
    r"\b(relocat\w*|mov(e|ed|es|ing)|transferr?\w*|former(ly)?|once|wrongly|mistaken(ly)?|misattribut\w*|"
    r"attributed|no longer|used to|now|today|shifted|originally|previously)\b", re.IGNORECASE)
# Sentences that deny any change, or that lean on a move stated elsewhere.
DENIES_CHANGE = re.compile(r"\b(no plans to (relocate|move)|never (moved|left)|has always been|always stood)\b",
                           re.IGNORECASE)
STATES_MOVE = re.compile(r"\b(moved|relocated|transferred|once hung)\b", re.IGNORECASE)
NEEDS_MOVE = re.compile(r"\b(relocating|the move|the new site|the transfer)\b", re.IGNORECASE)
SINGULAR_VERB = re.compile(r"^(is|was|has|\w+[^s\W]s)\b")  # "is", "stands" (not "always", "across")
# A sentence ends after a lowercase letter (accented too: "Brontë.") or digit, or after two capitals:
# a regnal number ("Johann Strauss II.") or a name in capitals ("BMW."); not after "D.C.", "J. K.",
# "St." or "Dr.".
# A sentence ends after a small letter, a digit or a bracket; after a name in capitals ("BMW."); and
# after a name that ends in one capital ("Madame X.") when a sentence's first word follows (initials,
# "J. K. Rowling", are followed by another capital or a name instead).
SENTENCE_END = re.compile(r"(?<!\bSt)(?<!\bDr)(?<=[a-zà-ÿ0-9)])[.!?]\s+|(?<=[A-Z]{2})\.\s+(?=[A-Z])"
                          r"|(?<=\s[A-Z])\.\s+(?=(?:The|It|Its|This|A|An|In|Few|Many|Most|Some|Writers|Art)\b)")


def sentences(text: str) -> list[str]:
    return SENTENCE_END.split(text)


def _fact(item: Item) -> tuple[dict, dict] | None:
    record = relations_by_name().get(item.relation)
    fact = facts_by_subject().get((item.relation, item.subject))
    return (record, fact) if record and fact else None


def _creator_outside_time(items: list[Item]) -> list[str]:
    bad = []
    for item in items:
        found = _fact(item)
        if found and "creators" in found[0]:
            span = lifespans(item.relation).get(item.counterfactual_answer)
            if not active_in(span, work_year(found[1])):
                bad.append(item.id)
    return bad


def _museum_outside_period(items: list[Item]) -> list[str]:
    return [i.id for i in items if (found := _fact(i)) and "collections" in found[0]
            and not collects(found[0], i.counterfactual_answer, work_year(found[1]))]


def _also_true(items: list[Item]) -> list[str]:
    return [i.id for i in items if (found := _fact(i))
            and also_true(found[0], i.parametric_answer, [i.counterfactual_answer, *i.counterfactual_aliases])]


def _outside_region(items: list[Item]) -> list[str]:
    bad = []
    for item in items:
        found = _fact(item)
        region = region_of(*found) if found else None
        if region is not None and not any(same_answer(item.counterfactual_answer, a) for a in region):
            bad.append(item.id)
    return bad


def _singular_verb_for_plural(items: list[Item]) -> list[str]:
    bad = []
    for item in items:
        found = _fact(item)
        if found and found[1].get("plural"):
            text = f"{item.context} {item.question}"
            # the subject as the grammatical subject: at a sentence start or after "that"
            pattern = re.compile(rf"(?:^|[.!?]\s+|\bthat\s+){re.escape(item.subject)}\s+(\S+)", re.IGNORECASE)
            if any(SINGULAR_VERB.match(m.group(1)) for m in pattern.finditer(text)):
                bad.append(item.id)
    return bad


def _speaks_of_change(items: list[Item]) -> list[str]:
    return [i.id for i in items if CHANGE_WORDS.search(i.context)]


def _unstated_change(items: list[Item]) -> list[str]:
    """Default items state no change; former items never deny the change they state, and a sentence
    about "the move" comes only with a sentence that states the move."""
    bad = []
    for i in items:
        if not i.mentions_parametric:
            broken = bool(CHANGE_WORDS.search(i.context))
        else:
            moved = bool(STATES_MOVE.search(i.context))
            broken = (moved and bool(DENIES_CHANGE.search(i.context))) or (bool(NEEDS_MOVE.search(i.context))
                                                                           and not moved)
        if broken:
            bad.append(i.id)
    return bad


def _container_accepted(items: list[Item]) -> list[str]:
    """A water body (or place) that contains the counterfactual is implied by the context: it must not
    count as the true answer (the North Sea's Atlantic, against the English Channel)."""
    bad = []
    for i in items:
        found = _fact(i)
        if found and "within" in found[0]:
            record = found[0]
            outer = containers(record, i.counterfactual_answer)
            forms = dict(answer_pool(record))
            implied = [f for c in outer for f in (c, *forms.get(c, []))]
            if any(same_answer(a, f) for a in i.parametric_aliases for f in implied):
                bad.append(i.id)
    return bad


def _name_gives_answer(items: list[Item]) -> list[str]:
    """A subject whose name places it or names its maker (India Gate, the AK-47; ``name_implies_answer``),
    or shares a word of 4+ letters with the true answer."""
    def gives(i: Item) -> bool:
        found = _fact(i)
        answer_words = {w for a in (i.parametric_answer, *i.parametric_aliases) for w in words(a) if len(w) >= 4}
        return bool(found and found[1].get("name_implies_answer")) or bool(
            answer_words & {w for w in words(i.subject) if len(w) >= 4})
    return [i.id for i in items if gives(i)]


# Answer sentences that only imply the answer (visitors, a style, a main site) instead of stating it.
IMPLIES_ONLY = re.compile(r"\b(visitors to|travell?ers come to|climbers travel to|style of|typical of|main site|"
                          r"surrounding countryside|employees of)\b", re.IGNORECASE)


def _answer_not_stated(items: list[Item]) -> list[str]:
    return [i.id for i in items
            if not any(contains_any(s, [i.counterfactual_answer]) and not IMPLIES_ONLY.search(s)
                       for s in sentences(i.context))]


def _moved_abroad(items: list[Item]) -> list[str]:
    """Headquarters (and landmarks, mountains) keep to the ``regions`` group of their true answer; for
    company_headquarters a group is a country, so no item moves a company abroad."""
    bad = []
    for i in items:
        found = _fact(i)
        if found and found[0]["relation"] == "company_headquarters":
            group = region_of(*found) or []
            countries = [g for g in found[0]["regions"].values() if any(same_answer(i.parametric_answer, a) for a in g)]
            if not any(same_answer(i.counterfactual_answer, a) for a in group) or len(countries) != 1:
                bad.append(i.id)
    return bad


def _lowercase_sentence_start(items: list[Item]) -> list[str]:
    return [i.id for i in items if any(s[:1].islower() for s in [*sentences(i.context), i.question])]


def _sentence_without_subject(items: list[Item]) -> list[str]:
    """The first sentence names the subject; every later one names it, calls it by its kind ("the
    river", the relation's ``kind``) or, for a singular subject, opens with "It" ("The location was
    chosen ..." refers to nothing the passage introduced)."""
    def refers(item: Item, sentence: str, first: bool) -> bool:
        if contains_any(sentence, [item.subject]):
            return True
        found = _fact(item)
        if first or not found or found[1].get("plural"):
            return False
        return contains_any(sentence, found[0]["kind"]) or sentence.startswith("It ")
    return [i.id for i in items
            if not all(refers(i, s, n == 0) for n, s in enumerate(sentences(i.context)))]


_DIGITS = re.compile(r"\d")


@lru_cache(maxsize=1)
def _named_things() -> dict[str, str]:
    """Proper names of the tables that an about.json sentence must not use -> what they name: people,
    countries, cities, nationalities and every answer of a relation."""
    named: dict[str, str] = {}
    for p in tables.people():
        named.update({n: "a person" for n in (p["name"], p["surname"])})
        named.update({n: "a place" for n in (p["birth_city"], p["death_city"], p["birth_country"]) if n})
    for c in tables.countries():
        named.update({n: "a place" for n in (c["name"], *c["aliases"], c["capital"], c["largest_city"], c["other_city"])})
    for n in tables.people_meta()["nationalities"]:
        named.update({a: "a nationality" for a in (n["adjective"], *n.get("nouns", []))})
    for record in tables.relations():
        named.update({a: f"an answer of {record['relation']}" for answer, aliases in answer_pool(record)
                      for a in (answer, *aliases)})
    return {n: what for n, what in named.items() if n and len(n) > 2}


@lru_cache(maxsize=1)
def _named_pattern() -> re.Pattern:
    names = sorted(_named_things(), key=len, reverse=True)
    return re.compile(rf"(?<!\w)(?:{'|'.join(map(re.escape, names))})(?!\w)")


def _names_in(text: str, allowed: set[str]) -> list[str]:
    return [m.group(0) for m in _named_pattern().finditer(text) if m.group(0) not in allowed]


def about_problems(records: tuple[dict, ...] | None = None) -> list[str]:
    """One line per about.json sentence that could point to or rule out an answer: it names a person,
    place, nationality or answer of the tables (case-sensitive, whole words, ``fictional_names``
    excepted), has a digit (a year, a height), speaks of a change (``CHANGE_WORDS``), does not open
    with ``{Subject}`` (the builder's references need it) or is not one sentence to ``sentences``."""
    out = []
    for record in records if records is not None else tables.load_table("about.json"):
        allowed = set(record.get("fictional_names", []))
        for sentence in record["sentences"]:
            why = [f"names {_named_things()[name]} ({name})" for name in _names_in(sentence, allowed)]
            why += ["has a digit"] if _DIGITS.search(sentence) else []
            why += [f"speaks of a change ({m.group(0)})"] if (m := CHANGE_WORDS.search(sentence)) else []
            why += ["does not open with {Subject}"] if not sentence.startswith("{Subject} ") else []
            # the passage's sentence split must find its end ("... 'To be, or not to be'." does not end one)
            why += ["is not one sentence to the splitter"] if len(sentences(f"{sentence} Next.")) != 2 else []
            out += [f"{record['subject']}: {sentence!r}: {'; '.join(why)}"] if why else []
    return out


@lru_cache(maxsize=1)
def _fictional_names() -> dict[str, set[str]]:
    return {r["subject"]: set(r.get("fictional_names", [])) for r in tables.load_table("about.json")}


def _names_outside_answer(items: list[Item]) -> list[str]:
    """Only the sentence that states the answer names a person, place, nationality or answer of the
    tables, or a year: every other sentence (the subject's about.json sentences, reasons, fillers) must
    hold whatever answer the passage states."""
    bad = []
    for i in items:
        answers = [i.counterfactual_answer, i.parametric_answer]
        allowed = _fictional_names().get(i.subject, set())
        for sentence in sentences(i.context):
            if contains_any(sentence, answers):
                continue
            text = re.sub(re.escape(i.subject), "", sentence, flags=re.IGNORECASE)
            if _DIGITS.search(text) or _names_in(text, allowed):
                bad.append(i.id)
                break
    return bad


def _former_length_gap(items: list[Item]) -> list[str]:
    """The ``_former`` passages are, on average, as long as their twins' (within ``cues.FORMER_LENGTH_GAP``)."""
    former = [i for i in items if i.mentions_parametric and i.dataset.endswith("_former")]
    if not former:
        return []
    twins = {i.id: a for i, a in build_pairs(former[0].dataset, former[0].version, former[0].seed,
                                                             former=True)}
    gaps = [len(i.context.split()) - len(" ".join(twins[i.id]).split()) for i in former if i.id in twins]
    gap = sum(gaps) / max(len(gaps), 1)
    return [f"<mean gap {gap:+.1f} words>"] if abs(gap) > cues.FORMER_LENGTH_GAP else []


EXTRA_RULES = {
    "creator_in_time": (f"a counterfactual creator was alive and at least {MIN_CREATOR_AGE} in the work's year",
                        _creator_outside_time),
    "counterfactual_not_true": ("the counterfactual neither contains nor lies in the true answer (within) "
                                "nor shares its metropolitan area", _also_true),
    "counterfactual_in_region": ("the counterfactual lies in the fact's region (a river's basin; the true "
                                 "answer's group)", _outside_region),
    "plural_agreement": ("a plural subject takes a plural verb", _singular_verb_for_plural),
    "no_unstated_change": ("no sentence implies a change the passage does not state (or denies one it states)",
                           _unstated_change),
    "sentence_case": ("every sentence and the question start with a capital letter", _lowercase_sentence_start),
    "sentence_refers_to_subject": ("the first sentence names the subject; every later one names it, calls it by "
                                   "its kind or opens with It", _sentence_without_subject),
    "museum_collects_period": ("a counterfactual museum collects art of the painting's year", _museum_outside_period),
    "container_not_true_answer": ("no water body or place that contains the counterfactual counts as the true answer "
                                  "(the context implies it too)", _container_accepted),
    "name_gives_answer": ("no subject whose name places it or names its maker (name_implies_answer), or shares a "
                          "word with the true answer", _name_gives_answer),
    "answer_stated": ("a sentence states the counterfactual, not only implies it (visitors, a style, a main site)",
                      _answer_not_stated),
    "headquarters_same_country": ("a counterfactual headquarters lies in the company's own country",
                                  _moved_abroad),
    "names_only_in_answer_sentence": ("only the answer sentence names a person, place, nationality or answer of the "
                                      "tables, or a year (about.json sentences hold for any answer)",
                                      _names_outside_answer),
    **cues.RULES,
    "former_length_matched": (f"a _former passage is as long as its twin on average (within "
                              f"{cues.FORMER_LENGTH_GAP} words)", _former_length_gap),
}

# The agreeing twins (cf_world_facts_agree, cf_world_facts_former_agree): the rules above that are about
# the text, not about the counterfactual (which the twins no longer state). A twin states no change:
# its passage names only the true answer, so a change word would speak of a change it never states.
AGREE_RULES = {
    "agree_no_change": ("no sentence speaks of a change or of a belief about the answer (the twin states none)",
                        _speaks_of_change),
    "plural_agreement": EXTRA_RULES["plural_agreement"],
    "sentence_case": EXTRA_RULES["sentence_case"],
    "sentence_refers_to_subject": EXTRA_RULES["sentence_refers_to_subject"],
    **cues.TEXT_RULES,
}
