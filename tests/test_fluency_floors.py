"""Passages that read as naturally as the benchmark promises, measured as ``benchmarks/fluency_bench.py``
measures them (its default sample: 150 passages drawn with seed 0): distinct word bigrams over the sample's
first 4,000 words at least a floor, and the default model's mean loss over each passage's first 64 tokens
at most a ceiling (slow: loads the model)."""

import pytest

from dataset_builders import DEFAULT_SEED, build

# dataset: (distinct bigrams per 100 words over 4,000 words, at least; first-64-token loss, at most).
# Biographies: 65 bigrams, and no worse a loss than version 4's 3.12. World facts: the paper's released
# passages' 65.3 bigrams, and no worse a loss than version 4's 3.39.
FLOORS = {"cf_bio": (65.0, 3.12), "cf_world_facts": (65.3, 3.39)}


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("fluency_bench")


def sample(bench, name):
    return bench.bench_sample([item.context for item in build(name, DEFAULT_SEED)])


def test_the_sample_is_the_benchmarks(bench):
    passages = [str(k) for k in range(400)]
    assert bench.bench_sample(passages) == bench.bench_sample(passages)  # seeded
    assert len(bench.bench_sample(passages)) == 150 and len(set(bench.bench_sample(passages))) == 150
    assert bench.bench_sample(passages, seed=1) != bench.bench_sample(passages)
    assert bench.bench_sample(passages[:20]) and len(bench.bench_sample(passages[:20])) == 20


@pytest.mark.parametrize("name", sorted(FLOORS))
def test_distinct_bigrams_at_equal_length_meet_the_floor(bench, name):
    floor = FLOORS[name][0]
    assert bench.bigrams_at_words(sample(bench, name)) >= floor, name


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FLOORS))
def test_first_64_token_loss_stays_under_the_ceiling(bench, name):
    ceiling = FLOORS[name][1]
    whole, first = bench.mean_token_loss(sample(bench, name))
    print(f"{name}: loss per token {whole:.2f}, over the first 64 tokens {first:.2f} (ceiling {ceiling})")
    assert first <= ceiling, name
