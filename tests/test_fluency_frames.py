"""Passages a person would write: no sentence frame repeats within a passage and none dominates a
dataset (frames as ``benchmarks/fluency_bench.py`` measures them: names and values masked)."""

import pytest

from dataset_builders import DEFAULT_SEED, build, cf_capitals, cf_world_facts

MAX_FRAME_SHARE = 0.10  # the most frequent frame's share of a dataset's sentences


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("fluency_bench")


@pytest.mark.parametrize("name", ["cf_bio", "cf_world_facts", "cf_world_facts_former", "cf_capitals",
                                  "cf_capitals_former"])
def test_no_frame_dominates_a_dataset(bench, name):
    share, frame = bench.frame_share(build(name, DEFAULT_SEED))
    assert share < MAX_FRAME_SHARE, (name, f"{share:.1%}", frame)


@pytest.mark.parametrize("name, split", [("cf_world_facts", cf_world_facts.sentences),
                                         ("cf_capitals", cf_capitals.sentences)])
def test_no_sentence_repeats_within_a_passage(name, split):
    for item in build(name, DEFAULT_SEED):
        sentences = [s.strip(" .") for s in split(item.context)]
        assert len(sentences) == len(set(sentences)), item.id


def test_bigram_measure(bench):
    assert bench.bigrams_per_100_words(["a b a b"]) == pytest.approx(50.0)  # (a b), (b a): 2 of 4 words
    assert bench.bigrams_per_100_words(["a b", "a b"]) == pytest.approx(25.0)


def test_bigram_measure_at_equal_length(bench):
    assert bench.bigrams_at_words(["a b c d", "e f"], n_words=3) == pytest.approx(100 * 2 / 3)  # a b c: 2 of 3
    assert bench.bigrams_at_words(["a b"] * 10, n_words=4) == pytest.approx(25.0)  # two passages, then cut
