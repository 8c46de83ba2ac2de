"""The fact tables: sizes, required fields, and the rules that keep them usable as ground truth."""

import json

import pytest

from cf_tasks.text import contains, normalize
from dataset_builders import tables
from dataset_builders.tables import TableError, load_table


def test_people_table():
    people = tables.people()
    assert len(people) >= 120
    domains = {p["domain"] for p in people}
    assert len(domains) >= 5
    surnames = [normalize(p["surname"]) for p in people]
    assert len(set(surnames)) == len(surnames)
    for p in people:
        assert len(p["works"]) >= 2, p["id"]
        assert p["surname"] in p["aliases"], p["id"]
        assert p["pronoun"] in ("he", "she")
        assert 0 < p["birth_year"] < 2010
        assert p["death_year"] is None or p["death_year"] > p["birth_year"]
        for work in p["works"]:
            assert not contains(work, p["surname"]), (p["id"], work)


def test_countries_table():
    countries = tables.countries()
    assert len(countries) == 195
    for c in countries:
        capitals = [c["capital"], *c["capital_aliases"]]
        if c["other_city"]:
            assert not any(normalize(c["other_city"]) == normalize(x) for x in capitals), c["id"]
        assert c["continent"] in {"Africa", "Asia", "Europe", "North America", "South America", "Oceania"}


def test_relations_table():
    relations = tables.relations()
    assert len(relations) >= 7
    for r in relations:
        assert len(r["facts"]) >= 25, r["relation"]
        assert len({normalize(f["answer"]) for f in r["facts"]}) >= 8
        for f in r["facts"]:
            assert not contains(f["subject"], f["answer"]), f


def test_quotes_table():
    quotes = tables.quotes()
    assert len(quotes) >= 150
    for q in quotes:
        assert q["saying"].split()[-1] == q["last_word"]
        assert not contains(q["saying"].rsplit(" ", 1)[0], q["last_word"]), q["id"]
        assert q["last_word"] not in q["alternatives"]


def test_missing_field_is_named(tmp_path):
    (tmp_path / "quotes.json").write_text(json.dumps({"version": 1, "quotes": [{"id": "x", "saying": "a b"}]}))
    with pytest.raises(TableError, match=r"quotes.json: record x lacks field\(s\) last_word, alternatives; add them"):
        load_table("quotes.json", tmp_path)


def test_corrupt_table_is_named(tmp_path):
    (tmp_path / "people.json").write_text("{not json")
    with pytest.raises(TableError, match=r"people.json: not valid JSON"):
        load_table("people.json", tmp_path)


def test_people_nationality_fields_and_places():
    """people.json v2: nationality adjective + noun + aliases agree with the nationalities table;
    England or Scotland, not "United Kingdom", as birth and death countries; no monarch, activist or astronaut
    labelled politician or explorer."""
    from dataset_builders import cf_bio

    table = cf_bio.nationalities()
    nouns = {n for entry in table.values() for n in entry["nouns"]}
    for p in tables.people():
        entry = table[p["nationality"]]
        assert p["nationality_noun"] in entry["nouns"], p["id"]
        for alias in p["nationality_aliases"]:
            assert alias != p["nationality"] and (alias in table or alias in nouns), (p["id"], alias)
        assert "United Kingdom" not in (p["birth_country"], p["death_country"]), p["id"]
        if entry["since"] is not None:  # the real nationality passes the plausibility bound too
            assert entry["since"] <= p["birth_year"] + cf_bio.NATIONALITY_LATEST, p["id"]
    for adjective, entry in table.items():
        # Africa by its parts: a name of one people and a life under one state's history stay there
        assert entry["region"] in {"North Africa", "West Africa", "East Africa", "Southern Africa", "Americas", "Asia",
                                   "Europe", "Oceania"}, adjective
        assert entry["countries"] and entry["nouns"], adjective
    domains = {p["id"]: p["domain"] for p in tables.people()}
    assert domains["elizabeth_i"] == domains["queen_victoria"] == "monarch"
    assert domains["emmeline_pankhurst"] == domains["susan_b_anthony"] == "activist"
    assert domains["neil_armstrong"] == domains["mae_jemison"] == domains["valentina_tereshkova"] == "astronaut"
    people = {p["id"]: p for p in tables.people()}
    assert people["jacinda_ardern"]["nationality"] == "New Zealand"
    assert people["jacinda_ardern"]["nationality_noun"] == "New Zealander"
    assert "British" in people["william_shakespeare"]["nationality_aliases"]
