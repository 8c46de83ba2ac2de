"""What a world-facts passage says besides its answer, and the counterfactuals it rules out.

A title, its characters and the documented description carry cues: a novel about Raskolnikov is a
Russian novel, an Italian opera is an opera, "Schönbrunn Palace" is a German name. A counterfactual
that such a cue speaks against can be read as wrong from the passage alone, and then a low
``counterfactual_acc`` is a sensible reading, not a preference for memory. The attributes live in
``data/relations.json``, one home each:

- ``creator_traits`` of a relation (books, compositions, paintings, inventions): per creator, the
  ``forms`` they worked in (novel, play, poetry, stories; opera, ballet, orchestral, piano, ...;
  painting; an inventor's fields: medicine, textiles, timekeeping, ...) and the ``cultures`` their
  work belongs to; each work's fact has its ``form`` and the ``cultures`` its title, characters and
  description fit ("the Venus of Urbino" is Italian, "Guernica" Spanish). A counterfactual creator
  shares the form and one culture (``creator_fits``): no smallpox vaccine from a textile inventor, no
  portrait from a painter of none. A fact's ``ruled_out`` names creators its description sets it against
  (the phonograph's cylinders against Emile Berliner's discs).
- ``name_languages`` of a landmark or mountain fact: the languages its name speaks ([]: none); a
  counterfactual place speaks one of them (``speaks_name``). A city's languages are the relation's
  ``languages``; a country's come from countries.json (``language``, ``other_languages``) and the
  relation's ``regional_languages`` (Hawaiian in the United States).
- ``denies`` of a fact in relations.json (the Liberty Bell, shown indoors, is no ``outdoors`` sight;
  Mount Cook is no ``walkable`` peak) or of an about.json record (the Analytical Engine was never fully
  ``built``), and a relation's ``presumes`` (the templates, of any pool, that take the property for
  granted): no passage holds a sentence that is false of its own subject (``contradicted_templates``).
"""

from __future__ import annotations

import re
from functools import lru_cache

from . import tables
from .common import same_answer


def creator_fits(record: dict, fact: dict, creator: str) -> bool:
    """The creator worked in the work's ``form`` (one of them, where it lists several: the cotton gin is
    textiles and agriculture) and, where the work has ``cultures``, shares one of them (no traits: True)."""
    traits = record.get("creator_traits")
    if traits is None:
        return True
    own = traits.get(creator)
    if own is None:
        raise ValueError(f"relations.json {record['relation']}: creator {creator!r} has no creator_traits; "
                         f"add its forms (and cultures where the works have them)")
    if creator in fact.get("ruled_out", []):  # the description sets the work against this creator's
        return False
    forms = {fact["form"]} if isinstance(fact["form"], str) else set(fact["form"])
    return bool(forms & set(own["forms"])) and (
        "cultures" not in fact or bool(set(fact["cultures"]) & set(own.get("cultures", []))))


@lru_cache(maxsize=1)
def _country_languages() -> dict[str, list[str]]:
    return {c["name"]: [c["language"], *c.get("other_languages", [])] for c in tables.countries()}


def answer_languages(record: dict, answer: str) -> list[str]:
    """The languages spoken in a place answer: the relation's ``languages``, else countries.json's
    official ones and the relation's ``regional_languages`` (Hawaiian in the United States)."""
    table = record.get("languages") or _country_languages()
    found = [langs for place, langs in table.items() if same_answer(place, answer)]
    if len(found) != 1:
        raise ValueError(f"relations.json {record['relation']}: {answer!r} needs its languages in exactly one "
                         f"place (the relation's languages or countries.json)")
    regional = [lang for place, langs in record.get("regional_languages", {}).items() if same_answer(place, answer)
                for lang in langs]
    return [*found[0], *regional]


def speaks_name(record: dict, fact: dict, place: str) -> bool:
    """The place speaks a language of the subject's name (a name in no language fits any place)."""
    wanted = fact.get("name_languages") or []
    return not wanted or bool(set(wanted) & set(answer_languages(record, place)))


@lru_cache(maxsize=1)
def _about_denials() -> dict[str, tuple[str, ...]]:
    return {r["subject"]: tuple(r.get("denies", [])) for r in tables.load_table("about.json")}


def denials(record: dict, subject: str) -> list[str]:
    """What the subject is not (``denies``): its fact's in relations.json (the Liberty Bell is no outdoor
    sight) and its about.json record's (the Analytical Engine was never fully built). Each must name a
    ``presumes`` key of the relation: a misspelt one would keep nothing out."""
    fact = next((f for f in record["facts"] if f["subject"] == subject), {})
    out = [*fact.get("denies", []), *_about_denials().get(subject, ())]
    unknown = [what for what in out if what not in record.get("presumes", {})]
    if unknown:
        raise ValueError(f"relations.json {record['relation']}: {subject} denies {', '.join(map(repr, unknown))}, "
                         f"which the relation's presumes does not name; fix the key or add it to presumes")
    return out


def contradicted_templates(record: dict, subject: str) -> set[str]:
    """The relation's templates that presume what the subject's fact or description denies."""
    presumes = record.get("presumes", {})
    return {t for what in denials(record, subject) for t in presumes[what]}


TEMPLATE_POOLS = ("opening_sentences", "reason_sentences", "filler_sentences", "answer_sentences",
                  "former_sentences", "change_sentences", "change_reasons")


def presumes_problems(record: dict) -> list[str]:
    """One line per ``presumes`` template that is no template of the relation (a typo keeps nothing out)
    and per fact whose denials leave one of its template pools empty."""
    own = {t for pool in TEMPLATE_POOLS for t in record.get(pool, [])}
    out = [f"relations.json {record['relation']}: presumes {what!r} names {t!r}, which is no template of the "
           f"relation; copy the template exactly" for what, ts in record.get("presumes", {}).items()
           for t in ts if t not in own]
    for fact in record["facts"]:
        left_out = contradicted_templates(record, fact["subject"])
        out += [f"relations.json {record['relation']}: {fact['subject']} keeps no {pool}; deny less or add "
                f"templates" for pool in TEMPLATE_POOLS if record.get(pool) and set(record[pool]) <= left_out]
    return out


@lru_cache(maxsize=None)
def template_pattern(template: str) -> re.Pattern:
    """A filled template (its final full stop left off), with the subject given by name, kind or "it"
    (any words) and number forms."""
    text = re.escape(template.rstrip("."))
    for slot in ("subject", "Subject", "it", "its", "them", "answer", "Answer", "parametric", "Parametric"):
        text = text.replace(re.escape("{" + slot + "}"), r".+?")
    text = re.sub(r"\\\{(is|was|has)\\\}", r"\\w+", text).replace(re.escape("{s}"), "s?")
    return re.compile(text, re.IGNORECASE)





# --- validator rules (cf_world_facts, cf_world_facts_former and, for the text, their twins) ----------

from cf_tasks.text import contains_any  # noqa: E402

from .schema import Item  # noqa: E402

FORMER_LENGTH_GAP = 1.5  # words: the most a _former passage may be longer or shorter than its twin on average
_SPLIT = re.compile(r"(?<!\bSt)(?<!\bDr)(?<=[a-zà-ÿ0-9)])[.!?]\s+|(?<=[A-Z]{2})\.\s+(?=[A-Z])")


def _parts(item: Item) -> list[str]:
    """The passage's sentences; a sentence may end with the subject's name ("... as H&M.")."""
    marked = re.sub(rf"(?<=\b{re.escape(item.subject)})\.\s+(?=[A-Z])", ".\n", item.context)
    return [p for chunk in marked.split("\n") for p in _SPLIT.split(chunk)]


@lru_cache(maxsize=1)
def _records() -> dict[str, dict]:
    return {r["relation"]: r for r in tables.relations()}


def _found(item: Item) -> tuple[dict, dict] | None:
    record = _records().get(item.relation)
    fact = next((f for f in record["facts"] if f["subject"] == item.subject), None) if record else None
    return (record, fact) if fact else None


def _creator_misfit(items: list[Item]) -> list[str]:
    return [i.id for i in items if (found := _found(i)) and "creator_traits" in found[0]
            and (i.counterfactual_answer not in found[0]["creator_traits"]
                 or not creator_fits(*found, i.counterfactual_answer))]


def _place_misfit(items: list[Item]) -> list[str]:
    return [i.id for i in items if (found := _found(i)) and found[1].get("name_languages")
            and not speaks_name(*found, i.counterfactual_answer)]


def _contradicted(items: list[Item]) -> list[str]:
    bad = []
    for i in items:
        found = _found(i)
        patterns = [template_pattern(t) for t in contradicted_templates(found[0], i.subject)] if found else []
        if any(p.fullmatch(s.strip().rstrip(".")) for p in patterns for s in _parts(i)):
            bad.append(i.id)
    return bad


SUBJECT_POOLS = ("opening_sentences", "reason_sentences", "filler_sentences")  # templates with no answer slot


@lru_cache(maxsize=None)
def _pool_patterns(relation: str) -> tuple[re.Pattern, ...]:
    record = _records()[relation]
    return tuple(template_pattern(t) for pool in SUBJECT_POOLS for t in record.get(pool, []))


def _template_twice(items: list[Item]) -> list[str]:
    """No opening, reason or filler template fills two sentences of a passage, whatever stands for the
    subject ("It rewards a long, slow look." and "Girl with a Pearl Earring rewards a long, slow look.")."""
    bad = []
    for i in items:
        if i.relation not in _records():
            continue
        parts = [p.strip().rstrip(".") for p in _parts(i)]
        if any(sum(bool(p.fullmatch(s)) for s in parts) > 1 for p in _pool_patterns(i.relation)):
            bad.append(i.id)
    return bad


def _kind_repeated(items: list[Item]) -> list[str]:
    """A kind ("the landmark") at most once in a passage."""
    return [i.id for i in items if (found := _found(i)) and any(
        len(re.findall(rf"\b{re.escape(k)}\b", i.context, re.IGNORECASE)) > 1 for k in found[0].get("kind", []))]


def _stand_ins(item: Item, record: dict) -> list[str]:
    return [item.subject, *record.get("kind", []), "it"]


def _it_after_other_noun(items: list[Item]) -> list[str]:
    """A sentence that opens with "It" follows one that opens with the subject (its name, kind or "it")."""
    bad = []
    for i in items:
        found = _found(i)
        if not found:
            continue
        heads = [h.casefold() for h in _stand_ins(i, found[0])]
        parts = _parts(i)
        if any(s.startswith("It ") and not any(prev.casefold().startswith(h + " ") for h in heads)
               for prev, s in zip(parts, parts[1:])):
            bad.append(i.id)
    return bad


_MUSEUM = re.compile(r"\bthe (museum|gallery|galleries)\b", re.IGNORECASE)


def _museum_before_named(items: list[Item]) -> list[str]:
    """No sentence speaks of "the museum" before a sentence has named one."""
    bad = []
    for i in items:
        if i.relation != "painting_museum":
            continue
        for s in _parts(i):
            if contains_any(s, [i.counterfactual_answer, i.parametric_answer]):
                break
            if _MUSEUM.search(s):
                bad.append(i.id)
                break
    return bad


def _city_accepts_other_place(items: list[Item]) -> list[str]:
    """A question for a city accepts only the city's own forms (not "Washington", the Space Needle's state)."""
    return [i.id for i in items if (found := _found(i)) and found[0]["answer_label"] == "city"
            and any(a not in found[1].get("answer_aliases", []) for a in i.parametric_aliases)]


def _double_stop(items: list[Item]) -> list[str]:
    return [i.id for i in items if ".." in i.context]


TEXT_RULES = {
    "single_full_stop": ('no sentence ends with two full stops ("Washington, D.C.."))', _double_stop),
    "description_not_contradicted": ("no sentence presumes what the subject's fact or description denies (presumes, "
                                     "denies)", _contradicted),
    "kind_once": ("a passage calls its subject by its kind (the landmark) at most once", _kind_repeated),
    "template_once": ("no opening, reason or filler template fills two sentences of a passage, whatever stands for "
                      "the subject", _template_twice),
    "it_follows_subject": ('a sentence that opens with "It" follows one that opens with the subject', _it_after_other_noun),
    "museum_named_first": ('no sentence speaks of "the museum" before one names it', _museum_before_named),
}
RULES = {
    "creator_fits_work": ("a counterfactual creator wrote in the work's form and shares one of its cultures "
                          "(creator_traits)", _creator_misfit),
    "place_speaks_name": ("a counterfactual place speaks a language of the subject's name (name_languages)",
                          _place_misfit),
    "city_answer_only_city": ("a city question accepts only the true city's own forms, no state or region it lies in",
                              _city_accepts_other_place),
    **TEXT_RULES,
}
