"""The sweep's check of the lm-eval hooks it relies on (cf_tasks/sweep/upstream.py; the vLLM ones are
tested in test_sweep_vllm.py): a changed shape is one line naming the package, its version and the fix."""

import importlib.metadata
import inspect

import pytest
from lm_eval.api.task import ConfigurableTask, Task
from lm_eval.models.huggingface import HFLM

from cf_tasks.sweep import SweepError, upstream


def without(monkeypatch, func, name: str) -> None:
    """Give ``func`` the signature an upstream release without parameter ``name`` would have."""
    sig = inspect.signature(func)
    changed = sig.replace(parameters=[p for p in sig.parameters.values() if p.name != name])
    monkeypatch.setattr(func, "__signature__", changed, raising=False)


def test_the_installed_lm_eval_has_what_the_hf_sweep_relies_on():
    upstream.check("hf")


@pytest.mark.parametrize("change", ["_model_generate without stop", "_model_generate without **kwargs",
                                    "model not read from _model"])
def test_a_changed_lm_eval_hook_is_one_line_with_the_package_version_and_fix(monkeypatch, change):
    if change == "_model_generate without stop":
        without(monkeypatch, HFLM._model_generate, "stop")
    elif change == "_model_generate without **kwargs":
        without(monkeypatch, HFLM._model_generate, "generation_kwargs")
    else:
        monkeypatch.setattr(HFLM, "model", property(lambda self: self.wrapped))
    with pytest.raises(SweepError) as info:
        upstream.check("hf")
    line = str(info.value)
    version = importlib.metadata.version("lm-eval")
    assert "\n" not in line
    assert line.startswith(f"lm-eval {version} does not have HFLM.")
    assert f'pip install "lm-eval{upstream.TESTED["lm-eval"]}"' in line


def test_params_and_uses_read_the_real_code():
    def generate(self, context, *args, stop=None, **kwargs):
        return self.model.generate(context)

    assert upstream.params(generate) == ["self", "context", "*args", "stop", "**kwargs"]
    assert upstream.uses(generate, "model", "generate") and not upstream.uses(generate, "lora_request")


@pytest.mark.parametrize("change", ["doc_to_text without its doc_to_text argument",
                                    "construct_requests without **kwargs",
                                    "fewshot_context not rendering through doc_to_text",
                                    "build_all_requests not handing the context to construct_requests",
                                    "ConfigurableTask without config"])
def test_a_changed_task_hook_of_the_known_tasks_is_one_line(monkeypatch, change):
    """KnownTask (the <task>_known tasks) returns two prompts where lm-eval expects one: the lm-eval
    code that lets it do so is checked like the sweep's own hooks."""
    if change == "doc_to_text without its doc_to_text argument":
        without(monkeypatch, ConfigurableTask.doc_to_text, "doc_to_text")
    elif change == "construct_requests without **kwargs":
        without(monkeypatch, ConfigurableTask.construct_requests, "kwargs")
    elif change == "fewshot_context not rendering through doc_to_text":
        monkeypatch.setattr(ConfigurableTask, "fewshot_context", lambda self, doc, num_fewshot, **kwargs: doc["text"])
    elif change == "build_all_requests not handing the context to construct_requests":
        monkeypatch.setattr(Task, "build_all_requests", lambda self, **kwargs: self.requests_from(kwargs))
    else:
        without(monkeypatch, ConfigurableTask.__init__, "config")
    with pytest.raises(SweepError) as info:
        upstream.check("hf")
    line = str(info.value)
    version = importlib.metadata.version("lm-eval")
    assert "\n" not in line
    assert line.startswith(f"lm-eval {version} does not have ")
    assert "which the <task>_known tasks (two prompts per item) rely on" in line
    assert f'pip install "lm-eval{upstream.TESTED["lm-eval"]}"' in line
