"""``cf-tasks eval``: one model on some tasks with lm-eval (default: the embedded SmolLM2).

Every argument is checked before any model loads, each once: the flags that need no task index
first, then the task names and ``--metadata``'s keys against the one index the run builds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import RunError, UsageError
from ..files import ascii_float
from ..trackers import add_arguments as add_tracker_arguments
from .common import ATTENTION_HELP, METADATA_HELP, NO_KNOWLEDGE_HELP, check_trackers, parse_metadata, task_list


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a model (default: the embedded SmolLM2) with lm-eval")
    p.add_argument("--model", default="hf", help="lm-eval model type (hf, vllm, ...)")
    p.add_argument("--model_args", default=None, help="lm-eval model_args; omit for the default model")
    p.add_argument("--tasks", default="cf_suite", help="comma-separated tasks or groups")
    p.add_argument("--limit", type=ascii_float, default=None, help="items per task (lm-eval --limit)")
    p.add_argument("--batch_size", default=None,
                   help="lm-eval batch size (default: 1; for the default model, one that is fast and gives the same answers)")
    p.add_argument("--device", default=None, help="lm-eval device (default: cuda if available, else cpu)")
    p.add_argument("--output_path", default=None, help="folder for results JSON and samples")
    p.add_argument("--metadata", default=None, help=METADATA_HELP)
    p.add_argument("--apply_chat_template", action="store_const", const=True, default=None,
                   help="wrap prompts in the model's chat template (default: on for the default model only)")
    p.add_argument("--no_apply_chat_template", "--no-apply_chat_template", dest="apply_chat_template",
                   action="store_const", const=False, help="raw prompts, also for the default model")
    p.add_argument("--no_knowledge", action="store_true", help=NO_KNOWLEDGE_HELP)
    p.add_argument("--attention", action="store_true", help=ATTENTION_HELP)
    add_tracker_arguments(p)
    p.set_defaults(func=run)


def check_model_type(model: str) -> None:
    """``--model``: an lm-eval model type whose packages are installed."""
    import difflib

    import lm_eval.models  # noqa: F401  (registers the model names; each model imports on first use)
    from lm_eval.api.registry import get_model, model_registry

    from ..sweep.checks import pip_line, vllm_available, vllm_missing

    names = sorted(model_registry.keys())
    if model not in names:
        close = difflib.get_close_matches(model, names, n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise UsageError(f"--model {model}: not an lm-eval model type{hint}; pass e.g. --model hf")
    if model == "vllm" and not vllm_available():
        raise UsageError(vllm_missing("--model"))
    try:
        get_model(model)
    except ImportError as err:
        raise UsageError(f"--model {model} needs a Python package that is missing ({err}); {pip_line(err.name)}") from None


def check_pretrained(pretrained: str) -> None:
    """A local model folder, or a Hub id (which must be in the local cache when offline)."""
    import os

    from ..checkpoints import model_exists

    if Path(pretrained).expanduser().is_dir():
        return
    if pretrained.startswith((".", "/", "~")) or pretrained.count("/") > 1:
        raise UsageError(f"--model_args pretrained={pretrained}: no such model folder; pass a model folder or a Hub id")
    if os.environ.get("HF_HUB_OFFLINE") == "1" and not model_exists(pretrained):
        raise UsageError(f"--model_args pretrained={pretrained}: neither a folder nor a model in the local Hugging Face "
                         "cache (HF_HUB_OFFLINE is set); pass a model folder, or download the model once online")


def check_arguments(args: argparse.Namespace, tasks: list[str]) -> dict:
    """Every check of ``cf-tasks eval`` that needs no task index, the sweep's own: one line each.
    Returns the parsed ``--model_args``."""
    from ..attention import HF_MODELS, UNAVAILABLE
    from ..sweep.model_args import check_values, check_batch_size, check_device, check_keys, parse_model_args
    from ..sweep.checks import check_limit, check_output_folder, check_tasks_given

    check_tasks_given(tasks)
    check_limit(args.limit)
    check_batch_size(args.batch_size)
    if args.output_path:
        check_output_folder(Path(args.output_path))
    if args.attention and args.model not in HF_MODELS:
        raise UsageError(UNAVAILABLE.format(where=f"--model {args.model}", fix="--model hf"))
    if not args.model_args and args.model != "hf":
        raise UsageError(f"--model {args.model} needs --model_args (the default model is for --model hf)")
    check_model_type(args.model)
    model_args = parse_model_args(args.model_args)
    backend = "hf" if args.model in HF_MODELS else "vllm" if args.model == "vllm" else None
    if backend:
        check_keys(model_args, backend)
        check_values(model_args)
    if "device" in model_args and args.device is not None and str(model_args["device"]) != args.device:
        raise UsageError(f"--device {args.device} and --model_args device={model_args['device']} disagree; "
                         "give one of them")
    if args.device is not None:
        check_device(args.device)
    elif "device" in model_args and backend == "hf":
        check_device(model_args["device"], "--model_args device=")
    if backend == "hf" and isinstance(model_args.get("pretrained"), str):
        check_pretrained(model_args["pretrained"])
    return model_args


def eval_settings(args: argparse.Namespace, tasks: list[str], metadata: dict | None) -> dict:
    """What makes two evals' results different results: the model, its arguments, the tasks and
    how they are asked, as given on the command line (batch size and device are left out)."""
    return {"model": args.model, "model_args": args.model_args, "tasks": sorted(set(tasks)), "limit": args.limit,
            "metadata": metadata, "apply_chat_template": args.apply_chat_template,
            "knowledge": not args.no_knowledge, "attention": bool(args.attention)}


FLAGS = {"knowledge": "--no_knowledge"}  # a setting named otherwise than its flag


def check_used_folder(out: Path, settings: dict) -> None:
    """An ``--output_path`` that holds another eval's results is refused before any model loads: a
    finished result is never replaced by one of other settings. The same settings run again replace
    their own results."""
    from ..results import EVAL_SETTINGS

    found = out / "results.json"
    if not found.is_file():
        return
    try:
        earlier = json.loads((out / EVAL_SETTINGS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        earlier = None
    now = json.loads(json.dumps(settings))  # as settings.json reads back (tuples as lists, ...)
    if earlier == now:
        return
    differ = ("its settings are not recorded" if not isinstance(earlier, dict) else
              "other " + ", ".join(FLAGS.get(k, f"--{k}") for k in now if earlier.get(k) != now[k]))
    raise UsageError(f"--output_path {out} holds the results of another eval ({differ}); pass another "
                     f"--output_path, or delete {found} to replace them")


def run(args: argparse.Namespace) -> int:
    from lm_eval.utils import make_table

    from ..default_model import DEFAULT_MODEL_BATCH_SIZE, default_model_path
    from ..evaluate import default_device, knowledge_probe, needs_builtin_tasks, our_task_names, run_lm_eval
    from ..registry import task_manager
    from ..sweep.checks import check_task_metadata, check_task_names, load_task

    tasks = task_list(args.tasks)
    metadata = parse_metadata(args.metadata)  # its values; its keys below, once the tasks are known
    given_args = check_arguments(args, tasks)
    settings = eval_settings(args, tasks, metadata)
    if args.output_path:
        check_used_folder(Path(args.output_path), settings)
    trackers = check_trackers(args, eval_keys=True)
    # Built once: lm-eval's own index (~7 s) only when a task is not ours.
    tm = task_manager(include_defaults=needs_builtin_tasks(tasks), metadata=metadata)
    check_task_names(tasks, tm)
    check_task_metadata(tasks, metadata, values=False)
    ours = our_task_names()
    for name in tasks:  # another package's dataset may need the Hub: known before the model loads
        if name not in ours:
            load_task(tm, name)
    model_args = args.model_args
    device, batch_size = args.device, args.batch_size
    if not model_args:
        path = default_model_path()
        model_args = f"pretrained={path},dtype=float32"
        if batch_size is None:
            # Greedy answers equal to batch 1's; benchmarks/eval_bench.py measures both side by side.
            batch_size = DEFAULT_MODEL_BATCH_SIZE
        if args.apply_chat_template is None:
            args.apply_chat_template = True  # an instruct model: raw prompts mostly get <|im_end|>
        print(f"cf-tasks: evaluating the default model {path}", file=sys.stderr)
    if device is None and args.model == "hf" and "device" not in given_args:
        # lm-eval's HFLM takes "cuda" as given and fails on a CPU-only machine.
        device = default_device()
    probe = None if args.no_knowledge else knowledge_probe(tasks, tm)
    results = run_lm_eval(
        args.model, tasks, model_args=model_args, limit=args.limit, batch_size=batch_size or 1, device=device,
        metadata=metadata, apply_chat_template=bool(args.apply_chat_template),
        log_samples=bool(args.output_path), task_manager=tm, knowledge=probe, attention=args.attention,
    )
    if results is None:
        return 0
    print(make_table(results))
    if "groups" in results:
        print(make_table(results, "groups"))
    if trackers:
        from ..results import tidy_rows
        from ..trackers.reporter import report_eval

        report_eval(trackers, tidy_rows(results))
    if args.output_path:
        from ..results import land_results

        try:
            path = land_results(results, Path(args.output_path), settings)
        except OSError as err:  # checked before the run, but a disk fills and permissions change:
            # not a bad argument, so exit 1, as a sweep or report that cannot write
            raise RunError(f"--output_path {args.output_path}: cannot write the results "
                           f"({err.strerror or type(err).__name__}); the table above is all that was kept: "
                           "free space or fix permissions and run again") from None
        print(f"cf-tasks: results written to {path}", file=sys.stderr)
    return 0
