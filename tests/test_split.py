"""The subject split: seeded, balanced, one part per subject across datasets, and the ``split`` task
metadata that keeps the held-out part (the builds' bytes unchanged)."""

import json
from pathlib import Path

import pytest

from cf_tasks.tasks import load
from dataset_builders import build, version
from dataset_builders.serialize import sha256, to_jsonl_bytes
from dataset_builders.split import (
    FAMILIES, SPLIT_SEED, all_subjects, check_split, family_of, mentions_heldout, part_of_key, split_of,
    subject_key, subjects,
)

GOLDEN = json.loads((Path(__file__).parent / "data" / "dataset_sha256.json").read_text())


# Parts computed once with SPLIT_SEED 20250421: a change of the seed or of the hash would move
# subjects between the parts, and a study's evaluation would then hold training subjects.
KNOWN_PARTS = {"the Mona Lisa": "heldout", "Apple": "train", "the Nile": "heldout", "France": "heldout",
               "Japan": "train", "Marie Curie": "train", "Germany": "heldout"}


def test_split_is_seeded_and_stable():
    assert {name: split_of("cf_world_facts", name) for name in KNOWN_PARTS} == KNOWN_PARTS
    moved = sum(part_of_key(s.key, SPLIT_SEED + 1) != part_of_key(s.key) for s in all_subjects())
    assert 0.3 < moved / len(all_subjects()) < 0.7  # another seed is another split


@pytest.mark.parametrize("family", FAMILIES)
def test_split_is_about_half_in_each_family(family):
    train, heldout = len(subjects("train", family)), len(subjects("heldout", family))
    assert train and heldout and 0.4 <= heldout / (train + heldout) <= 0.6


def test_same_subject_same_part_across_datasets():
    # a person: cf_bio stores the id, world facts and ic_recall name them
    assert split_of("cf_bio", "marie_curie") == split_of("cf_world_facts", "Marie Curie") == \
        split_of("ic_recall", "Marie Curie")
    # a country: the table's name in cf_capitals, the running-text form elsewhere
    assert subject_key("the United States") == subject_key("United States")
    assert split_of("cf_capitals", "United States") == split_of("cf_world_facts", "the United States")
    # one subject in two relations of cf_world_facts (the Mona Lisa: its museum and its painter)
    items = [i for i in build("cf_world_facts", 1234) if i.subject == "the Mona Lisa"]
    assert {i.relation for i in items} == {"painting_museum", "painting_painter"}
    assert len({split_of(i.dataset, i.subject) for i in items}) == 1
    assert family_of("cf_capitals_former_agree") == "cf_capitals" and family_of("ic_recall_cf") == "ic_recall"


def test_split_metadata_keeps_one_part_and_the_build_bytes():
    full = load("cf_capitals")["test"]
    heldout = load("cf_capitals", split="heldout")["test"]
    train = load("cf_capitals", split="train")["test"]
    assert 0 < len(heldout) < len(full) and len(heldout) + len(train) == len(full)
    assert {split_of("cf_capitals", s) for s in heldout["subject"]} == {"heldout"}
    assert set(heldout["id"]).isdisjoint(train["id"])
    # the build itself did not change: the golden digest still holds, and no split gives the build
    items = build("cf_capitals", 1234)
    assert sha256(to_jsonl_bytes(items)) == GOLDEN["cf_capitals"][str(version("cf_capitals"))]["1234"]
    assert list(full["id"]) == [i.id for i in items]


def test_variants_filter_identically():
    heldout = list(load("cf_capitals", split="heldout")["test"]["id"])
    assert list(load("cf_capitals_agree", split="heldout")["test"]["id"]) == heldout
    bio = load("cf_bio", split="heldout")["test"]
    assert {split_of("cf_bio", s) for s in bio["subject"]} == {"heldout"}


def test_split_reaches_every_variant_through_lm_eval():
    from cf_tasks.registry import task_manager

    expected = len(load("cf_capitals", split="heldout")["test"])
    tasks = task_manager(metadata={"split": "heldout"}).load(
        ["cf_capitals", "cf_capitals_mc", "cf_capitals_known", "cf_capitals_closedbook", "cf_capitals_agree"])["tasks"]
    sizes = {name: len(task.test_docs()) for name, task in tasks.items()}
    assert len(sizes) == 5 and sizes == {name: expected for name in sizes}


def test_bad_split_is_one_line():
    with pytest.raises(ValueError, match=r"split='test' is not one of heldout, train") as err:
        load("cf_capitals", split="test")
    assert "\n" not in str(err.value)
    assert check_split(None) is None and check_split("heldout") == "heldout"


def test_mentions_heldout_reads_proper_names_only():
    assert split_of("cf_capitals", "France") == split_of("cf_capitals", "United States") == "heldout"
    assert mentions_heldout("The museum stands in France.") == ["France"]
    assert mentions_heldout("Paris is a city of FRANCE.") == ["France"]
    assert mentions_heldout("No country is named here.") == []
    # a held-out name that is also a common word matches only as a name
    assert mentions_heldout("They told us the US was far.") == ["United States"]
    assert mentions_heldout("They told us a story about turkey and china.") == []
    assert mentions_heldout("Ambassadors present their credentials.") == []  # not "The Ambassadors"
    assert split_of("cf_world_facts", "The Ambassadors") == "heldout"


def test_a_name_inside_a_longer_name_is_not_a_mention():
    assert split_of("cf_capitals", "Sudan") == "heldout" and split_of("cf_capitals", "South Sudan") == "train"
    assert mentions_heldout("South Sudan is a country in Africa.") == []
    assert mentions_heldout("Bolivia is a country in South America.") == []  # not "America", the US
    assert mentions_heldout("South Sudan borders Sudan.") == ["Sudan"]
