"""The bundled SmolLM2-135M-Instruct on the suite, with the knowledge probe (slow: ~3-4 minutes on 2
CPU cores; CI runs it)."""

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    from lm_eval.models.huggingface import HFLM

    from cf_tasks.default_model import default_model_path

    return HFLM(pretrained=str(default_model_path()), dtype="float32", device="cpu", batch_size=8)


@pytest.fixture(scope="module")
def suite_results(smollm2):
    from cf_tasks.evaluate import knowledge_probe, run_lm_eval
    from cf_tasks.registry import task_manager

    # The suite with the knowledge probe (as cf-tasks eval runs it), and the two datasets outside
    # the suite through their _known tasks.
    tasks = ["cf_suite", "cf_capitals_closedbook", "cf_world_facts_former_known", "cf_capitals_former_known"]
    tm = task_manager()
    # An instruct model: without its chat template SmolLM2 answers most raw prompts with <|im_end|>.
    return run_lm_eval(smollm2, tasks, limit=20, apply_chat_template=True, task_manager=tm,
                       knowledge=knowledge_probe(tasks, tm))["results"]


def test_suite_figures_are_in_range(suite_results):
    for task in ("cf_bio", "cf_world_facts", "cf_capitals", "cf_quotes", "cf_suite"):
        r = suite_results[task]
        print(f"{task}: counterfactual_acc {r['counterfactual_acc,none']:.2f} "
              f"parametric_acc {r['parametric_acc,none']:.2f}")
        cf, pa = r["counterfactual_acc,none"], r["parametric_acc,none"]
        both, neither = r["both_rate,none"], r["neither_rate,none"]
        assert 0 <= cf <= 1 and 0 <= pa <= 1
        # context-only + parametric-only + both + neither = 1
        assert (cf - both) + (pa - both) + both + neither == pytest.approx(1.0)
    # A 135M instruct model follows some counterfactual contexts: not all, not none.
    assert 0.05 < suite_results["cf_suite"]["counterfactual_acc,none"] < 0.95


def test_context_moves_the_model_on_capitals(suite_results):
    closed, ctx = suite_results["cf_capitals_closedbook"], suite_results["cf_capitals"]
    print(
        f"cf_capitals closed-book: counterfactual {closed['counterfactual_acc,none']:.2f} parametric "
        f"{closed['parametric_acc,none']:.2f}; with context: counterfactual {ctx['counterfactual_acc,none']:.2f} "
        f"parametric {ctx['parametric_acc,none']:.2f}"
    )
    # The counterfactual city is only ever named because the context names it. (For this 135M
    # model the passage also primes recall of the true capital, so parametric accuracy with
    # context is not below closed-book; see CHANGELOG. Since datasets v2 the passages give no
    # reason for a move they never state, and fewer items convince it: 2-3 of 20 at seed 1234.)
    assert ctx["counterfactual_acc,none"] > closed["counterfactual_acc,none"]
    assert ctx["counterfactual_acc,none"] >= 0.1


def test_known_rate_per_dataset(suite_results):
    from cf_tasks.known import KC_DATASETS

    rates = {}
    for dataset in KC_DATASETS:
        r = suite_results.get(dataset) or suite_results[f"{dataset}_known"]
        rates[dataset] = r["known_rate,none"]
        conditioned = "  ".join(f"{m} {r[m + ',none']:.2f}" for m in (
            "known_counterfactual_acc", "known_parametric_acc", "unknown_counterfactual_acc") if m + ",none" in r)
        print(f"{dataset}: known_rate {rates[dataset]:.2f}  {conditioned}")
        assert 0 <= rates[dataset] <= 1
    # The probe's closed-book answers are the closed-book task's: the same items, the same scores.
    assert rates["cf_capitals"] == pytest.approx(suite_results["cf_capitals_closedbook"]["parametric_acc,none"])
    # A 135M model knows some capitals without a passage, not all.
    assert 0 < rates["cf_capitals"] < 1
