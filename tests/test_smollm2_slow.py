"""The bundled SmolLM2-135M-Instruct on the suite (slow: ~2-3 minutes on 2 CPU cores; CI runs it)."""

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    from lm_eval.models.huggingface import HFLM

    from cf_tasks.default_model import default_model_path

    return HFLM(pretrained=str(default_model_path()), dtype="float32", device="cpu", batch_size=8)


@pytest.fixture(scope="module")
def suite_results(smollm2):
    from cf_tasks.evaluate import run_lm_eval

    # An instruct model: without its chat template SmolLM2 answers most raw prompts with <|im_end|>.
    return run_lm_eval(smollm2, ["cf_suite", "cf_capitals_closedbook"], limit=20, apply_chat_template=True)["results"]


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
