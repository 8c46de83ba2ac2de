"""The agreeing twins: ``<dataset>_agree`` holds the items of ``<dataset>`` with
the true answer stated in the passage. Each twin rule is shown to catch a defect injected into a
valid build; the twins' passages are the counterfactual passages with only the answer changed; the
lm-eval tasks report ``agree_acc``. (Every twin is also built and validated on 13 seeds by
``test_builders.py``, and its bytes are pinned by ``test_versions.py``.)"""

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

import dataset_builders
from cf_tasks.tasks import process_results_agree
from cf_tasks.text import contains
from dataset_builders import AGREE_TWINS, DEFAULT_SEED, build, cf_bio, cf_capitals, cf_quotes, cf_world_facts, cues, tables
from dataset_builders.validate import failures, rules_for_dataset
from builds import assert_clean

KC_DATASETS = ("cf_bio", "cf_world_facts", "cf_world_facts_former", "cf_capitals", "cf_capitals_former", "cf_quotes")
TASK_YAMLS = Path(__file__).resolve().parents[1] / "task_yamls"
SEEDS = (0, 1234, 41876)


@pytest.fixture(scope="module")
def twins():
    return {name: build(name, DEFAULT_SEED) for name in AGREE_TWINS.values()}


def _swap(items, old, new):
    return [new if i is old else i for i in items]


def _edit(items, item, **changes):
    return _swap(items, item, replace(item, **changes)), item.id


# --- injected defects --------------------------------------------------------------------------

def inject_counterfactual_left(items):
    item = items[len(items) // 2]
    return _edit(items, item, context=f"{item.context} Some say {item.counterfactual_answer.upper()}.")


def inject_alias_left(items):  # a surname alone names the substitute
    item = next(i for i in items if i.relation == "person_name")
    return _edit(items, item, context=f"{item.context} {item.counterfactual_aliases[0]} agreed.")


def inject_substitute_first_name(items):  # not an alias, still a fragment of the substitute's name
    item = next(i for i in items if i.relation == "person_name")
    first = item.counterfactual_answer.split()[0]
    return _edit(items, item, context=f"{item.context} Friends called the child {first}.")


def inject_true_answer_missing(items):
    item = items[3]
    return _edit(items, item, context=item.context.replace(item.parametric_answer, "somewhere"))


def inject_flag_off(items):
    item = items[4]
    return _edit(items, item, mentions_parametric=False)


def inject_other_question(items):
    item = items[5]
    return _edit(items, item, question=item.question.rstrip("?") + " today?")


def inject_missing_item(items):
    return items[:6] + items[7:], items[6].id


def inject_position_imbalance(items):
    moved = [replace(i, answer_position="beginning") if i.answer_position == "end" else i for i in items]
    return moved, next(i.id for i in moved if i.answer_position == "beginning")


def inject_change_word(items):  # a reason for a move the twin never states
    item = items[2]
    return _edit(items, item, context=f"{item.context} {item.subject} relocated after a long debate.")


def inject_move(items):
    item = items[2]
    return _edit(items, item, context=f"{item.context} Planners argued that {item.subject} should move its capital.")


def inject_not_born_in(items):
    item = next(i for i in items if i.relation == "birth_city")
    return _edit(items, item, context=item.context.replace(f"born in {item.parametric_answer}",
                                                           f"raised in {item.parametric_answer}"))


def inject_quote_asks_counterfactual(items):
    item = items[0]
    return _edit(items, item, context=cf_quotes.INSTRUCTION.format(word=item.counterfactual_answer))


def inject_quote_extra_text(items):  # the instruction with more text after it
    item = items[1]
    return _edit(items, item, context=f"{item.context} {item.counterfactual_answer}")


def inject_quote_article(items):  # "... you feed him for a" + "hour"
    item = next(i for i in items if i.id == "cf_quotes-give_a_man_a")
    return _edit(items, item, parametric_answer="hour", context=cf_quotes.INSTRUCTION.format(word="hour"))


POSITIONED = ("cf_world_facts_agree", "cf_world_facts_former_agree", "cf_capitals_agree", "cf_capitals_former_agree")
CASES = [
    # every twin: the shared agree rules
    *[(twin, "agree_no_counterfactual", inject_counterfactual_left) for twin in AGREE_TWINS.values()
      if twin != "cf_quotes_agree"],
    *[(twin, "agree_true_answer_in_context", inject_true_answer_missing) for twin in AGREE_TWINS.values()],
    *[(twin, "agree_same_items", inject_other_question) for twin in AGREE_TWINS.values()],
    *[(twin, "position_shares", inject_position_imbalance) for twin in POSITIONED],
    ("cf_world_facts_agree", "agree_true_answer_in_context", inject_flag_off),
    ("cf_bio_agree", "agree_same_items", inject_missing_item),
    # each twin's own
    ("cf_bio_agree", "agree_no_counterfactual", inject_alias_left),
    ("cf_bio_agree", "agree_bio_no_substitute_fragment", inject_substitute_first_name),
    ("cf_bio_agree", "agree_bio_birth_city_born_in", inject_not_born_in),
    ("cf_world_facts_agree", "agree_no_change", inject_change_word),
    ("cf_world_facts_former_agree", "agree_no_change", inject_change_word),
    ("cf_capitals_agree", "agree_no_move", inject_move),
    ("cf_capitals_former_agree", "agree_no_move", inject_move),
    ("cf_quotes_agree", "agree_no_counterfactual", inject_quote_asks_counterfactual),
    ("cf_quotes_agree", "agree_no_counterfactual", inject_quote_extra_text),
    ("cf_quotes_agree", "quote_article_agreement", inject_quote_article),
]


@pytest.mark.parametrize("twin, rule, inject", CASES, ids=[f"{t}-{r}-{i.__name__}" for t, r, i in CASES])
def test_twin_rule_catches_injected_defect(twins, twin, rule, inject):
    items = twins[twin]
    assert_clean(items)
    broken, bad_id = inject(items)
    hit = [line for line in failures(broken) if line.startswith(rule + ":")]
    assert len(hit) == 1 and bad_id in hit[0], failures(broken)


def test_every_twin_rule_is_tested_here_or_with_its_dataset():
    """A twin rule is injected above, or is the very rule (same check) of the counterfactual dataset
    (shared RULES included), whose own tests inject it."""
    injected = {(twin, rule) for twin, rule, _ in CASES}
    for base, twin in AGREE_TWINS.items():
        inherited = rules_for_dataset(base)
        for rule, (_, check) in rules_for_dataset(twin).items():
            assert (twin, rule) in injected or inherited.get(rule, (None, None))[1] is check, (twin, rule)


# --- the twins are the counterfactual datasets with the true answer ------------------------------

def test_every_knowledge_conflict_dataset_has_a_twin_of_its_version():
    assert AGREE_TWINS == {name: f"{name}_agree" for name in KC_DATASETS}
    # a twin's version moves with its dataset's: cf_bio 7, cf_world_facts 7 and cf_world_facts_former 6 have
    # twins of version 6, cf_quotes 4 of version 3; the capitals' twins are of version 2
    assert {twin: dataset_builders.version(twin) for twin in AGREE_TWINS.values()} == {
        "cf_bio_agree": 6, "cf_world_facts_agree": 6, "cf_world_facts_former_agree": 6,
        "cf_capitals_agree": 2, "cf_capitals_former_agree": 2, "cf_quotes_agree": 3}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("base", KC_DATASETS)
def test_twin_has_the_items_of_its_dataset_in_order(base, seed):
    cf_items, twin_items = build(base, seed), build(AGREE_TWINS[base], seed)
    keep = ("id", "relation", "subject", "question", "counterfactual_answer", "counterfactual_aliases",
            "parametric_answer", "parametric_aliases", "seed")
    assert [[getattr(i, k) for k in keep] for i in twin_items] == [[getattr(i, k) for k in keep] for i in cf_items]


@pytest.mark.parametrize("builder, dataset, former", [
    (cf_world_facts, "cf_world_facts", False), (cf_world_facts, "cf_world_facts_former", True),
    (cf_capitals, "cf_capitals", False), (cf_capitals, "cf_capitals_former", True),
])
def test_passage_twin_changes_only_the_answer_sentence(builder, dataset, former):
    """The same sentences in the same order; only the answer sentence differs, and in a former twin
    a reason given for the move ("Relocating the head office ..."), which gives way to another reason."""
    pairs = builder.build_pairs(dataset, dataset_builders.version(dataset), 1234, former)
    swapped_reasons = padded = 0
    for item, agree in pairs:
        context = item.context
        k = next(j for j, sentence in enumerate(agree) if contains(sentence, item.parametric_answer))
        if dataset == "cf_world_facts_former":  # the twin's spare filler beside its answer sentence (its length)
            fillers = [cues.template_pattern(t) for t in cf_world_facts.relations_by_name()[item.relation][
                "filler_sentences"]]
            pad = [j for j in (k - 1, k + 1) if 0 <= j < len(agree) and agree[j] not in context
                   and any(f.fullmatch(agree[j].rstrip(".")) for f in fillers)]
            if pad:
                agree = agree[:pad[0]] + agree[pad[0] + 1:]
                k -= pad[0] < k
                padded += 1
        others = agree[:k] + agree[k + 1:]
        kept = [sentence for sentence in others if sentence in context]
        at = [context.index(sentence) for sentence in kept]
        assert at == sorted(at), item.id
        swapped = len(others) - len(kept)
        assert swapped == len(re.findall(r"\brelocating\b", context, re.I)), item.id
        swapped_reasons += swapped
        if not swapped:  # the counterfactual passage is the twin with another answer sentence
            prefix, suffix = " ".join(agree[:k]), " ".join(agree[k + 1:])
            assert context.startswith(prefix) and context.endswith(suffix), item.id
            answer_sentence = context[len(prefix):len(context) - len(suffix)]
            assert contains(answer_sentence, item.counterfactual_answer), item.id
    assert (swapped_reasons > 0) == (dataset == "cf_world_facts_former")  # headquarters' change reasons
    assert (padded > len(pairs) / 2) == (dataset == "cf_world_facts_former")


def _possessive(name):
    return name + ("'" if name.endswith("s") else "'s")


def _mask_person(text, name, surname):
    """Every mention of the person (full name or surname, possessive or not, any case) as "<P>"."""
    forms = {_possessive(name): "<P>'s", _possessive(surname): "<P>'s", name: "<P>", surname: "<P>"}
    alternatives = "|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True))
    pattern = re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)", re.I)
    return pattern.sub(lambda m: forms[next(f for f in forms if f.lower() == m.group(0).lower())], text)


def _same_biography(twin, cf, person):
    """The twin's passage is the counterfactual one with the true name or value, derived forms included."""
    if twin.relation == "person_name":
        sub = next(p for p in tables.people() if p["name"] == twin.counterfactual_answer)
        return _mask_person(twin.context, person["name"], person["surname"]) == _mask_person(
            cf.context, sub["name"], sub["surname"])
    text = twin.context
    if twin.relation == "nationality":  # "an Italian painter" / "a Greek painter"
        article = "an" if twin.counterfactual_answer[0] in "AEIOU" else "a"
        text = re.sub(rf"\ban? {twin.parametric_answer}\b", f"{article} {twin.counterfactual_answer}", text)
    return text.replace(twin.parametric_answer, twin.counterfactual_answer) == cf.context


@pytest.mark.parametrize("seed", SEEDS)
def test_bio_twin_is_the_same_biography_with_the_true_name_or_value(seed):
    people = {p["id"]: p for p in tables.people()}
    cf_items = {i.id: i for i in build("cf_bio", seed)}
    twin_items = build("cf_bio_agree", seed)
    for item in twin_items:
        assert _same_biography(item, cf_items[item.id], people[item.subject]), item.id
    # "an Italian painter" in the twin where the counterfactual passage says "a Greek painter"
    nationality = [i for i in twin_items if i.relation == "nationality"]
    for item in nationality:
        wrong = "a" if item.parametric_answer[0] in "AEIOU" else "an"
        assert not re.search(rf"\b{wrong} {item.parametric_answer}\b", item.context), item.id
    assert any(re.search(rf"\ban {i.parametric_answer}\b", i.context) for i in nationality)
    assert any(re.search(rf"\ba {i.parametric_answer}\b", i.context) for i in nationality)


def test_quote_twin_asks_for_the_true_ending(twins):
    for item in twins["cf_quotes_agree"]:
        assert item.context == cf_quotes.INSTRUCTION.format(word=item.parametric_answer)
        assert f"{item.question} {item.parametric_answer}" == item.subject


def test_twin_builds_leave_the_counterfactual_builds_alone():
    """The twins draw from their own generator: the counterfactual items of build_pairs are build's."""
    assert [i for i, _ in cf_bio.build_pairs(7)] == cf_bio.build(7)
    assert [i for i, _ in cf_quotes.build_pairs(7)] == cf_quotes.build(7)


# --- tasks -------------------------------------------------------------------------------------

def test_agree_acc_counts_the_true_answer(twins):
    capital = twins["cf_capitals_agree"][0].to_dict()
    assert process_results_agree(capital, [f"The capital is {capital['parametric_answer']}."]) == {"agree_acc": 1.0}
    assert process_results_agree(capital, [f"It is {capital['counterfactual_answer']}."]) == {"agree_acc": 0.0}
    assert process_results_agree(capital, [f"Not {capital['parametric_answer']}."]) == {"agree_acc": 0.0}
    quote = twins["cf_quotes_agree"][0].to_dict()
    assert process_results_agree(quote, [f" {quote['parametric_answer']}."]) == {"agree_acc": 1.0}
    assert process_results_agree(quote, [f" {quote['counterfactual_answer']}."]) == {"agree_acc": 0.0}


def test_every_twin_has_a_task_with_agree_acc():
    import yaml

    for base, twin in AGREE_TWINS.items():
        path = TASK_YAMLS / base / f"{twin}.yaml"
        config = yaml.safe_load(path.read_text().replace("!function", ""))
        assert config["task"] == twin and config["metadata"]["dataset"] == twin
    agree_yaml = yaml.safe_load((TASK_YAMLS / "_agree_yaml").read_text().replace("!function", ""))
    assert [m["metric"] for m in agree_yaml["metric_list"]] == ["agree_acc"]


@pytest.mark.slow
def test_lm_eval_cli_reports_agree_acc_with_stderr(tiny_model, tmp_path):
    from test_lm_eval_e2e import _run

    from cf_tasks.registry import task_yamls_path

    out = tmp_path / "out"
    _run(["--model", "hf", "--model_args", f"pretrained={tiny_model},dtype=float32",
          "--tasks", "cf_capitals_agree,cf_quotes_agree", "--include_path", str(task_yamls_path()),
          "--limit", "4", "--output_path", str(out), "--log_samples"])
    report = json.loads(next(out.rglob("results_*.json")).read_text())
    for task in ("cf_capitals_agree", "cf_quotes_agree"):
        assert float(report["versions"][task]) == float(dataset_builders.version(task))
        result = report["results"][task]
        assert set(k for k in result if "," in k) == {"agree_acc,none", "agree_acc_stderr,none"}
        samples = [json.loads(line) for line in next(out.rglob(f"samples_{task}_*.jsonl")).open()]
        assert len(samples) == 4 and all(s["doc"]["dataset"] == task for s in samples)
        expected = [process_results_agree(s["doc"], s["filtered_resps"])["agree_acc"] for s in samples]
        assert result["agree_acc,none"] == pytest.approx(sum(expected) / 4)


def test_a_twin_keeps_its_datasets_ids_and_the_capitals_twins_are_two_tasks(twins):
    """Ids pair an item with its twin (paired statistics match them by id); the ``dataset`` field tells
    them apart. The two capitals twins ask the same questions with the same true answers, so they
    must differ in what they test: cf_capitals_agree names the true capital alone, and
    cf_capitals_former_agree names the counterfactual city as a belief the passage corrects, the
    mirror of the _former passage."""
    for base, twin in AGREE_TWINS.items():
        assert [i.id for i in build(base, DEFAULT_SEED)] == [i.id for i in twins[twin]], twin
        assert {i.dataset for i in twins[twin]} == {twin}
    plain, belief = twins["cf_capitals_agree"], twins["cf_capitals_former_agree"]
    assert not any(contains(i.context, i.counterfactual_answer) for i in plain)
    assert all(contains(i.context, i.counterfactual_answer) and contains(i.context, i.parametric_answer)
               for i in belief)
    assert not {i.context for i in plain} & {i.context for i in belief}
