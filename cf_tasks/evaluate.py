"""Running lm-eval on the cf-tasks (or any lm-eval task) with one loaded model.

``cf-tasks eval`` with no ``--model_args`` evaluates the embedded default model
(``default_model.py``). lm-eval's built-in task index (~7 s) is only built when a requested task
is not one of ours.
"""

from __future__ import annotations

from typing import Any


def default_device() -> str:
    """The device a run uses when none is given: the machine's GPU if it has one."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def our_task_names() -> set[str]:
    from .registry import task_manager

    return set(task_manager(include_defaults=False).all_tasks)


def needs_builtin_tasks(tasks: list[str]) -> bool:
    ours = our_task_names()
    return any(t not in ours for t in tasks)


def run_lm_eval(
    model: Any,
    tasks: list[str],
    model_args: str | dict | None = None,
    limit: float | None = None,
    batch_size: int | str = 1,
    metadata: dict | None = None,
    apply_chat_template: bool = False,
    log_samples: bool = False,
    task_manager=None,
    device: str | None = None,
    attention: bool = False,
) -> dict:
    """``lm_eval.simple_evaluate`` with a task manager that indexes built-ins only when needed.
    ``attention``: also measure ``context_attention`` (``cf_tasks.attention``) with the same model."""
    import lm_eval

    from .registry import task_manager as make_task_manager

    if task_manager is None:
        task_manager = make_task_manager(include_defaults=needs_builtin_tasks(tasks), metadata=metadata)
    name = model
    if attention and isinstance(model, str):
        # Built here as simple_evaluate builds it, so that the probe can use the same model.
        from lm_eval.api.registry import get_model

        extra = {"batch_size": batch_size, "max_batch_size": None, "device": device}
        maker = get_model(model)
        model = (maker.create_from_arg_obj(model_args, extra) if isinstance(model_args, dict)
                 else maker.create_from_arg_string(model_args or "", extra))
    results = lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=tasks,
        limit=limit,
        batch_size=batch_size,
        device=device,
        task_manager=task_manager,
        apply_chat_template=apply_chat_template,
        log_samples=log_samples or attention,
        metadata=metadata,
    )
    if attention and results is not None:
        from .attention import add_context_attention

        add_context_attention(model, results)
        if isinstance(name, str):
            results["config"]["model"] = name  # as simple_evaluate records a model it built itself
        if not log_samples:
            results.pop("samples", None)
    return results
