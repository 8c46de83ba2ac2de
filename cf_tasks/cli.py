"""The ``cf-tasks`` command line: build datasets (and, in later commands, evaluate and publish).

Errors a user can fix are printed as one line, ``cf-tasks: error: <what> ; <fix>``, with exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from .errors import UsageError
from .files import check_not_empty, writable_dir
from .trackers import add_arguments as add_tracker_arguments

ALPHA_HELP = ("significance level of the summary's paired tests: an inversion needs a significant rise and a "
              "significant fall at one peak, Holm-adjusted across the summary's series")
PEAK_STEP_HELP = ("test the rise (first -> peak) and the fall (peak -> final) at this checkpoint step, declared in "
                  "advance (e.g. the peak of another run), on all items; default: the two-lines test over every "
                  "checkpoint, the peak chosen inside its null")
NO_KNOWLEDGE_HELP = ("skip the knowledge probe: by default each knowledge-conflict task's items are also asked "
                     "closed-book in the same pass, adding known_rate, known_counterfactual_acc, "
                     "known_parametric_acc and unknown_counterfactual_acc")
MIXED_SCORERS_HELP = ("report a task whose rows were scored by different scorer versions instead of refusing: a "
                      "checkpoint scored under several versions shows only its latest version's rows, so an older "
                      "version's numbers of it leave the views")
ATTENTION_HELP = ("also measure context_attention: the attention of the position that predicts the first answer "
                  "token on the context passage, per knowledge-conflict item (hf models only)")


# Hyphenated spellings of earlier versions: still accepted, not shown (every flag is lm-eval's
# underscore style).
HIDDEN_ALIASES = frozenset({"--repo-id", "--dry-run", "--no-apply_chat_template", "--for-training"})


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, plus each option's default where it has one, minus the hidden aliases."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS) \
                and "default" not in text and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text

    def _format_action_invocation(self, action):
        shown = [s for s in action.option_strings if s not in HIDDEN_ALIASES]
        if len(shown) == len(action.option_strings):
            return super()._format_action_invocation(action)
        return super()._format_action_invocation(argparse.Action(shown, action.dest, nargs=action.nargs,
                                                                 metavar=action.metavar))


def cmd_build_training(args: argparse.Namespace) -> int:
    """``cf-tasks build --for_training``: training points of the training part (C, CS, S, CF)."""
    from dataset_builders.training import DEFAULT_KINDS, TRAINING_FORMATS, TrainingDataError, export, parse_kinds

    fmt = args.format or TRAINING_FORMATS[0]
    if fmt not in TRAINING_FORMATS:
        raise UsageError(f"--format {fmt} does not apply to --for_training; choose {' or '.join(TRAINING_FORMATS)}")
    if args.dataset != "all":
        raise UsageError("--dataset does not apply to --for_training; choose the points with --kinds")
    from dataset_builders.serialize import check_manifest_owner

    try:
        kinds = parse_kinds(args.kinds) if args.kinds is not None else DEFAULT_KINDS
        check_manifest_owner(Path(args.out), "kinds")
    except ValueError as err:
        raise UsageError(str(err)) from None
    out = writable_dir(args.out)
    try:
        manifest = export(kinds, fmt, args.seed, out)
    except TrainingDataError as err:
        raise UsageError(f"training points broke a rule:\n{err}\nfix the fact table or builder named above") from None
    if not args.quiet:
        for kind, entry in manifest["kinds"].items():
            families = ", ".join(f"{f} {n}" for f, n in entry["families"].items())
            print(f"{kind:3s} {entry['count']:6d} points ({families})  {out / entry['file']}")
        print(f"training points in {fmt} format, seed {args.seed}, split seed {manifest['split_seed']} "
              f"-> {out / 'manifest.json'}")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    import dataset_builders
    from dataset_builders.serialize import FORMATS, check_manifest_owner, sha256, write_dataset
    from dataset_builders.validate import ValidationError, build_validated

    from .files import atomic_write

    if args.for_training:
        return cmd_build_training(args)
    if args.kinds is not None:
        raise UsageError("--kinds applies only with --for_training; add --for_training or drop --kinds")
    args.format = args.format or FORMATS[0]
    if args.format not in FORMATS:
        raise UsageError(f"--format {args.format} is not one of {', '.join(FORMATS)} (alpaca and messages need "
                         "--for_training)")
    names = list(dataset_builders.DATASETS) if args.dataset == "all" else [args.dataset]
    for name in names:
        try:
            dataset_builders.builder(name)
        except dataset_builders.UnknownDataset as err:
            raise UsageError(str(err)) from None
    try:
        check_manifest_owner(Path(args.out), "datasets")
    except ValueError as err:
        raise UsageError(str(err)) from None
    out = writable_dir(args.out)
    manifest = {"seed": args.seed, "format": args.format, "datasets": {}}
    start = time.perf_counter()
    for name in tqdm(names, desc="building", unit="dataset", disable=args.quiet):
        try:
            items = build_validated(name, args.seed)
        except ValidationError as err:
            raise UsageError(f"{err}\nfix the fact table or builder named above and rebuild") from None
        path, data = write_dataset(items, out, name, args.format)
        manifest["datasets"][name] = {
            "file": path.name,
            "count": len(items),
            "version": dataset_builders.version(name),
            "sha256": sha256(data),
        }
    atomic_write(out / "manifest.json", (json.dumps(manifest, indent=2) + "\n").encode())
    elapsed = time.perf_counter() - start
    if not args.quiet:
        for name, entry in manifest["datasets"].items():
            print(f"{name:16s} {entry['count']:6d} items  v{entry['version']}  {out / entry['file']}")
        print(f"built {len(names)} dataset(s) with seed {args.seed} in {elapsed:.2f} s -> {out / 'manifest.json'}")
    return 0


def cmd_tasks_path(args: argparse.Namespace) -> int:
    from .registry import task_yamls_path

    if args.status:
        try:
            import cf_tasks_autoload
        except ImportError:
            print("off: cf_tasks_autoload is not installed; reinstall cf-tasks, or pass "
                  '--include_path "$(cf-tasks tasks-path)" to lm_eval')
            return 1
        line = cf_tasks_autoload.status()
        print(line)
        return 0 if line.startswith(("on:", "off: this lm-eval")) else 1
    print(task_yamls_path())
    return 0


def _parse_metadata(text: str | None) -> dict | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"--metadata is not valid JSON ({err.msg}); pass e.g. '{{\"seed\": 7}}'") from None
    if not isinstance(value, dict):
        raise UsageError("--metadata must be a JSON object, e.g. '{\"seed\": 7}'")
    from .hub import PublishError, check_source
    from .tasks import check_metadata

    try:
        check_metadata(value, only_ours=False)  # the rest once the tasks are known
        if isinstance(value.get("hub_repo"), str):  # a refused copy is said before any model loads
            check_source(value["hub_repo"], value.get("revision"))
    except (ValueError, PublishError) as err:
        raise UsageError(str(err)) from None
    return value


def _check_model_type(model: str) -> None:
    """``--model``: an lm-eval model type whose packages are installed."""
    import difflib

    import lm_eval.models  # noqa: F401  (registers the model names; each model imports on first use)
    from lm_eval.api.registry import get_model, model_registry

    from .sweep.plan import pip_line, vllm_available, vllm_missing

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


def _check_pretrained(pretrained: str) -> None:
    """A local model folder, or a Hub id (which must be in the local cache when offline)."""
    import os

    from .checkpoints import model_exists

    if Path(pretrained).expanduser().is_dir():
        return
    if pretrained.startswith((".", "/", "~")) or pretrained.count("/") > 1:
        raise UsageError(f"--model_args pretrained={pretrained}: no such model folder; pass a model folder or a Hub id")
    if os.environ.get("HF_HUB_OFFLINE") == "1" and not model_exists(pretrained):
        raise UsageError(f"--model_args pretrained={pretrained}: neither a folder nor a model in the local Hugging Face "
                         "cache (HF_HUB_OFFLINE is set); pass a model folder, or download the model once online")


def _check_eval_arguments(args: argparse.Namespace, tasks: list[str]) -> dict:
    """Every check of ``cf-tasks eval`` that needs no task index, the sweep's own: one line each.
    Returns the parsed ``--model_args``."""
    from .attention import HF_MODELS, UNAVAILABLE
    from .sweep import SweepError
    from .sweep.model_args import check_values, check_batch_size, check_device, check_keys, parse_model_args
    from .sweep.plan import check_limit, check_output_folder, check_tasks_given

    try:
        check_tasks_given(tasks)
        check_limit(args.limit)
        check_batch_size(args.batch_size)
        if args.output_path:
            check_output_folder(Path(args.output_path))
        if args.attention and args.model not in HF_MODELS:
            raise UsageError(UNAVAILABLE.format(where=f"--model {args.model}", fix="--model hf"))
        if not args.model_args and args.model != "hf":
            raise UsageError(f"--model {args.model} needs --model_args (the default model is for --model hf)")
        _check_model_type(args.model)
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
            _check_pretrained(model_args["pretrained"])
    except SweepError as err:
        raise UsageError(str(err)) from None
    return model_args


def cmd_eval(args: argparse.Namespace) -> int:
    from lm_eval.utils import make_table

    from .default_model import DEFAULT_MODEL_BATCH_SIZE, DefaultModelError, default_model_path
    from .evaluate import default_device, knowledge_probe, needs_builtin_tasks, our_task_names, run_lm_eval
    from .registry import task_manager
    from .sweep import SweepError
    from .sweep.plan import check_task_metadata, check_task_names, load_task

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    metadata = _parse_metadata(args.metadata)
    given_args = _check_eval_arguments(args, tasks)
    trackers = _check_trackers(args, eval_keys=True)
    # Built once: lm-eval's own index (~7 s) only when a task is not ours.
    tm = task_manager(include_defaults=needs_builtin_tasks(tasks), metadata=metadata)
    try:
        check_task_names(tasks, tm)
        check_task_metadata(tasks, metadata)
        ours = our_task_names()
        for name in tasks:  # another package's dataset may need the Hub: known before the model loads
            if name not in ours:
                load_task(tm, name)
    except SweepError as err:
        raise UsageError(str(err)) from None
    model_args = args.model_args
    device, batch_size = args.device, args.batch_size
    if not model_args:
        try:
            path = default_model_path()
        except DefaultModelError as err:
            raise UsageError(str(err)) from None
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
    from .attention import AttentionError

    try:
        results = run_lm_eval(
            args.model, tasks, model_args=model_args, limit=args.limit, batch_size=batch_size or 1, device=device,
            metadata=metadata, apply_chat_template=bool(args.apply_chat_template),
            log_samples=bool(args.output_path), task_manager=tm, knowledge=probe, attention=args.attention,
        )
    except AttentionError as err:
        raise UsageError(str(err)) from None
    if results is None:
        return 0
    print(make_table(results))
    if "groups" in results:
        print(make_table(results, "groups"))
    if trackers:
        from .results import tidy_rows
        from .trackers.reporter import report_eval

        report_eval(trackers, tidy_rows(results))
    if args.output_path:
        from .results import save_results

        try:
            path = save_results(results, Path(args.output_path))
        except OSError as err:  # checked before the run, but a disk fills and permissions change:
            # not a bad argument, so exit 1, as a sweep or report that cannot write
            print(f"cf-tasks: error: --output_path {args.output_path}: cannot write the results "
                  f"({err.strerror or type(err).__name__}); the table above is all that was kept: "
                  "free space or fix permissions and run again", file=sys.stderr)
            return 1
        print(f"cf-tasks: results written to {path}", file=sys.stderr)
    return 0


def _check_trackers(args: argparse.Namespace, eval_keys: bool = False) -> dict:
    from .trackers import TrackerError, check

    try:
        return check(args.report_to, args.report_args, eval_keys, getattr(args, "output_path", None))
    except TrackerError as err:
        raise UsageError(str(err)) from None


def _parse_shard(text: str) -> tuple[int, int]:
    if text == "auto":
        from .sweep import SweepError, shard_from_env

        try:
            return shard_from_env()
        except (SweepError, ValueError) as err:
            raise UsageError(str(err) if isinstance(err, SweepError) else
                             f"--shard auto: the Slurm array or RANK/WORLD_SIZE variables are not numbers ({err})") from None
    try:
        if not text.isascii():  # int() reads other scripts' digits: "١/٢" is not what a scheduler writes
            raise ValueError(text)
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard {text!r} is not I/N; pass e.g. --shard 0/2 for the first of two shards") from None
    if not 0 <= index < count:
        raise UsageError(f"--shard {text}: I must be in 0..N-1; pass e.g. --shard 0/{max(count, 2)}")
    return index, count


def _parse_alpha(text: str):
    from .sweep import SweepError, check_alpha

    try:
        return check_alpha(text)
    except SweepError as err:
        raise UsageError(str(err)) from None


def _parse_peak_step(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"--peak_step {text!r} is not a whole number; pass the step of a checkpoint, "
                         "e.g. --peak_step 200") from None


def cmd_sweep(args: argparse.Namespace) -> int:
    from .sweep import SweepConfig, SweepError, run_sweep, vllm_available

    alpha = _parse_alpha(args.alpha)
    backend = args.backend or ("vllm" if vllm_available() else "hf")
    cfg = SweepConfig(
        run_dir=Path(args.run_dir), tasks=[t.strip() for t in args.tasks.split(",") if t.strip()],
        output_path=Path(args.output_path),
        backend=backend, base=args.base, limit=args.limit, batch_size=args.batch_size,
        include_base=args.include_base, shard=_parse_shard(args.shard), watch=args.watch,
        poll_interval=args.poll_interval, settle_seconds=args.settle_seconds, max_polls=args.max_polls,
        device=args.device, tensor_parallel_size=args.tensor_parallel_size, model_args=args.model_args,
        apply_chat_template=args.apply_chat_template, metadata=_parse_metadata(args.metadata),
        lora_group=args.lora_group, lock_timeout=args.lock_timeout, alpha=alpha,
        peak_step=_parse_peak_step(args.peak_step),
        knowledge=not args.no_knowledge, agree=not args.no_agree, attention=args.attention, quiet=args.quiet,
        timings=args.timings, report_to=args.report_to, report_args=args.report_args,
    )
    try:
        failed = run_sweep(cfg)
    except SweepError as err:
        raise UsageError(str(err)) from None
    except OSError as err:
        return _write_failed(err)
    if failed:
        print(f"cf-tasks: {failed} checkpoint(s) failed; see the errors above and {cfg.output_path / 'sweep.json'}",
              file=sys.stderr)
        return 1
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .sweep import SweepError, report

    if args.compare:
        from .sweep.compare import cmd_compare

        return cmd_compare(args)
    outs = [Path(p) for p in args.outputs]
    if args.output_path is None and len(outs) > 1:
        raise UsageError(f"report would write the merged views into {outs[0]}, one of its inputs; pass "
                         f"--output_path NEW_FOLDER (or --output_path {outs[0]} to merge into it)")
    alpha, peak_step = _parse_alpha(args.alpha), _parse_peak_step(args.peak_step)
    try:
        if args.output_path:
            from .sweep.plan import check_output_folder

            check_output_folder(Path(args.output_path))
        report(outs, Path(args.output_path) if args.output_path else outs[0], alpha=alpha, items=args.items,
               mixed_scorers=args.mixed_scorers, peak_step=peak_step)
    except SweepError as err:
        raise UsageError(str(err)) from None
    except OSError as err:
        return _write_failed(err)
    return 0


def _write_failed(err: OSError) -> int:
    """A disk that filled or a folder that turned read-only mid-run: one line, exit 1 (finished
    results stay); any other OSError is a fault of cf-tasks and keeps its traceback."""
    from .files import write_failure

    line = write_failure(err)
    if line is None:
        raise err
    print(f"cf-tasks: error: {line}", file=sys.stderr)
    return 1


def _parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--seeds {text!r} is not a comma-separated list of integers; pass e.g. --seeds 0,1,2") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise UsageError(f"--seeds {text!r} needs one or more distinct integers; pass e.g. --seeds 0,1,2")
    return seeds


def cmd_experiment_mechanism(args: argparse.Namespace) -> int:
    seeds = _parse_seeds(args.seeds)
    if args.steps < 1:
        raise UsageError(f"--steps {args.steps} must be at least 1; pass e.g. --steps 200")
    out = writable_dir(args.output_path, "--output_path")
    from dataclasses import replace

    from .experiments.mechanism import ARMS, MechanismConfig, run_study

    start = time.perf_counter()
    summary = run_study(out, seeds, replace(MechanismConfig(), steps=args.steps), plots=not args.no_plots)
    at = {(r["arm"], r["quantity"], r["step"]): r["mean"] for r in summary}
    for arm in ARMS:
        curve = [(at[arm, "attn_context", step], step) for step in range(args.steps + 1)]
        peak, peak_step = max(curve)
        print(f"{arm:15s} attention on context: {curve[0][0]:.3f} at step 0, peak {peak:.3f} at step {peak_step}, "
              f"{curve[-1][0]:.3f} at the end; counterfactual accuracy {at[arm, 'cf_acc', 0]:.2f} -> "
              f"{max(at[arm, 'cf_acc', s] for s in range(args.steps + 1)):.2f} (peak) -> {at[arm, 'cf_acc', args.steps]:.2f}")
    print(f"{len(ARMS)} arms x {len(seeds)} seeds x {args.steps} steps in {time.perf_counter() - start:.1f} s -> {out}")
    return 0


def add_experiment_mechanism(experiments) -> None:
    p = experiments.add_parser(
        "mechanism", help="the paper's one-layer transformer (section 5): attention, losses and "
                          "counterfactual probes per fine-tuning step, four data arms")
    p.add_argument("--output_path", required=True, help="folder for <arm>.csv, summary.csv and <arm>.png")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--steps", type=int, default=200, help="fine-tuning steps per arm and seed (default 200)")
    p.add_argument("--no_plots", action="store_true", help="write the CSVs only")
    p.set_defaults(func=cmd_experiment_mechanism)


def cmd_publish(args: argparse.Namespace) -> int:
    """``cf-tasks publish``: export every dataset in the Hub layout, then upload it (unless --dry_run)."""
    import tempfile

    from . import hub
    from .hub import PublishError

    if args.results:
        from .sweep.publish import cmd_publish_results

        return cmd_publish_results(args)
    try:
        hub.check_repo_id(args.repo_id)
        if args.dry_run and not args.out:
            raise PublishError("--dry_run needs --out DIR, the folder to export to")
        token = None if args.dry_run else hub.get_token()
        if not args.dry_run:
            from huggingface_hub import constants

            if constants.HF_HUB_OFFLINE:  # said before building anything
                raise PublishError("the Hugging Face Hub is switched off (HF_HUB_OFFLINE is set); unset HF_HUB_OFFLINE "
                                   "to publish, or export with --dry-run --out DIR")
    except PublishError as err:
        raise UsageError(str(err)) from None
    try:
        with tempfile.TemporaryDirectory(prefix="cf-tasks-publish-") as tmp:
            out = writable_dir(args.out) if args.out else Path(tmp)
            # A dry run merges into the card already in --out; an upload merges into the remote card.
            exp = hub.export(out, args.seed, args.repo_id, progress=not args.quiet,
                         existing_card=None if args.dry_run else "")
            commit = None
            if not args.dry_run:
                commit = hub.upload(out, exp, args.repo_id, token, private=args.private, revision=args.revision)
    except PublishError as err:
        raise UsageError(hub.redact(str(err), token)) from None
    if not args.quiet:
        for name, c in exp.configs.items():
            print(f"{name:16s} {c.count:6d} items  v{c.version}  {c.path}")
        if commit is None:
            print(f"exported {len(exp.configs)} config(s) with seed {args.seed} to {out} "
                  f"(check with: datasets.load_dataset({str(out)!r}, {hub.DEFAULT_CONFIG!r}))")
        else:
            sha = getattr(commit, "oid", None) or "<commit sha>"
            print(f"published {len(exp.configs)} config(s) with seed {args.seed} to "
                  f"https://huggingface.co/datasets/{args.repo_id} ({args.revision} @ {sha})")
            print(f"evaluate it with: --metadata '{{\"hub_repo\": \"{args.repo_id}\", \"revision\": \"{sha}\"}}'")
    return 0


def add_publish_parser(sub) -> None:
    """Register ``cf-tasks publish`` on the CLI's subparsers."""
    from dataset_builders import DEFAULT_SEED

    p = sub.add_parser("publish", help="build every dataset and publish it as a Hub dataset repository")
    p.add_argument("--repo_id", "--repo-id", required=True, help="Hub dataset repository, ORG/NAME")
    p.add_argument("--private", action="store_true", help="create the repository as private")
    p.add_argument("--revision", default="main", help="branch to commit to")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="builder seed")
    p.add_argument("--dry_run", "--dry-run", action="store_true", help="write the repository layout to --out; upload nothing")
    p.add_argument("--out", "--output_path", dest="out", default=None, help="folder for the layout (required with --dry_run)")
    p.add_argument("--results", default=None, help="a sweep output folder: publish its results (sweep.csv, summary.csv, "
                   "items.csv, the plot, the settings) instead of the datasets")
    p.add_argument("--quiet", action="store_true", help="no progress or summary output")
    p.set_defaults(func=cmd_publish)


def build_parser() -> argparse.ArgumentParser:
    from dataset_builders import DEFAULT_SEED
    from dataset_builders.serialize import FORMATS

    parser = argparse.ArgumentParser(prog="cf-tasks", description="Knowledge-conflict tasks for lm-eval.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("build", help="build the counterfactual datasets (or training points) to files")
    p.add_argument("--dataset", default="all", help="dataset name or 'all' (default)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"builder seed (default {DEFAULT_SEED})")
    p.add_argument("--output_path", "--out", dest="out", metavar="DIR", required=True, help="output folder")
    p.add_argument("--format", default=None,
                   help=f"{' or '.join(FORMATS)} (default {FORMATS[0]}); with --for_training: alpaca (default) or "
                        "messages")
    p.add_argument("--for_training", "--for-training", dest="for_training", action="store_true",
                   help="write training points from the training part of the subject split instead: "
                        "<kind>.jsonl per kind and manifest.json (no held-out subject appears in any point)")
    p.add_argument("--kinds", default=None,
                   help="with --for_training, comma-separated: C (invented entities), CS (true facts with a passage "
                        "stating them), S (the same facts closed-book), CF (counterfactual items; the default)")
    p.add_argument("--quiet", action="store_true", help="no progress or summary output")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("tasks-path", help="print the task YAML folder (for lm_eval --include_path)")
    p.add_argument("--status", action="store_true",
                   help="instead, say whether plain `lm_eval --tasks cf_bio` finds the tasks here, and why (exit 1 if not)")
    p.set_defaults(func=cmd_tasks_path)

    p = sub.add_parser("eval", help="evaluate a model (default: the embedded SmolLM2) with lm-eval")
    p.add_argument("--model", default="hf", help="lm-eval model type (hf, vllm, ...)")
    p.add_argument("--model_args", default=None, help="lm-eval model_args; omit for the default model")
    p.add_argument("--tasks", default="cf_suite", help="comma-separated tasks or groups")
    p.add_argument("--limit", type=float, default=None, help="items per task (lm-eval --limit)")
    p.add_argument("--batch_size", default=None,
                   help="lm-eval batch size (default: 1; for the default model, one that is fast and gives the same answers)")
    p.add_argument("--device", default=None, help="lm-eval device (default: cuda if available, else cpu)")
    p.add_argument("--output_path", default=None, help="folder for results JSON and samples")
    p.add_argument("--metadata", default=None, help="JSON passed to the tasks, e.g. '{\"seed\": 7}'")
    p.add_argument("--apply_chat_template", action="store_const", const=True, default=None,
                   help="wrap prompts in the model's chat template (default: on for the default model only)")
    p.add_argument("--no_apply_chat_template", "--no-apply_chat_template", dest="apply_chat_template",
                   action="store_const", const=False, help="raw prompts, also for the default model")
    p.add_argument("--no_knowledge", action="store_true", help=NO_KNOWLEDGE_HELP)
    p.add_argument("--attention", action="store_true", help=ATTENTION_HELP)
    add_tracker_arguments(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("sweep", help="score every checkpoint of a fine-tuning run (full or LoRA)")
    p.add_argument("run_dir", help="folder holding checkpoint-N / step_N / global_stepN / epoch_N sub-folders")
    p.add_argument("--tasks", default="cf_suite", help="comma-separated lm-eval tasks or groups")
    p.add_argument("--output_path", required=True, help="sweep output folder (resumable)")
    p.add_argument("--backend", choices=("vllm", "hf"), default=None, help="default: vllm where installed, else hf")
    p.add_argument("--base", default=None, help="base model for LoRA adapters (default: from adapter_config.json)")
    p.add_argument("--limit", type=float, default=None, help="items per task (lm-eval --limit)")
    p.add_argument("--batch_size", default=None,
                   help="lm-eval batch size, a number, auto or auto:N (hf backend; default 8 on a CPU, 1 on a GPU)")
    p.add_argument("--include_base", action="store_true", help="also score the base model as step 0")
    p.add_argument("--shard", default="0/1",
                   help="I/N: score every N-th checkpoint starting at I (0-based); 'auto': I/N from "
                        "SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT or RANK/WORLD_SIZE")
    p.add_argument("--watch", action="store_true", help="keep polling RUN_DIR for new checkpoints")
    p.add_argument("--poll_interval", type=float, default=30.0, help="seconds between polls with --watch")
    p.add_argument("--settle_seconds", type=float, default=10.0,
                   help="with --watch, a checkpoint is complete once no file changed for this long")
    p.add_argument("--max_polls", type=int, default=None, help="with --watch, stop after this many polls")
    p.add_argument("--model_args", default=None,
                   help="lm-eval model_args for every checkpoint, on top of its pretrained/adapter, e.g. "
                        "dtype=bfloat16,gpu_memory_utilization=0.9 (default dtype=auto: the checkpoint's own)")
    p.add_argument("--device", default=None, help="hf backend device (default cuda if available, else cpu)")
    p.add_argument("--tensor_parallel_size", type=int, default=None,
                   help="vllm backend tensor parallelism (default 1; or --model_args tensor_parallel_size=N)")
    p.add_argument("--lora_group", type=int, default=4,
                   help="LoRA adapters of one base generated together in one batch (1: one at a time)")
    p.add_argument("--apply_chat_template", action="store_true", help="wrap prompts in the chat template")
    p.add_argument("--metadata", default=None, help="JSON passed to the tasks, e.g. '{\"seed\": 7}'")
    p.add_argument("--lock_timeout", type=float, default=6 * 3600.0,
                   help="seconds after which another host's claim on a checkpoint is taken over when it has no "
                        "heartbeat (a claim of a dead process on this host, or one whose heartbeat stopped for 5 "
                        "minutes, is taken over sooner)")
    p.add_argument("--alpha", default="0.05",
                   help=ALPHA_HELP)
    p.add_argument("--peak_step", default=None, help=PEAK_STEP_HELP)
    p.add_argument("--quiet", action="store_true",
                   help="print only failures and the closing line (no progress bars, no summary table)")
    p.add_argument("--no_knowledge", action="store_true", help=NO_KNOWLEDGE_HELP)
    p.add_argument("--no_agree", action="store_true",
                   help="do not run each knowledge-conflict task's agreeing twin (<dataset>_agree, where installed)")
    p.add_argument("--attention", action="store_true", help=ATTENTION_HELP)
    p.add_argument("--timings", action="store_true",
                   help="print the seconds of each phase (start-up, task index, datasets, model loads, evaluation, "
                        "writing, views) at the end, and write them to OUTPUT_PATH/timings/")
    add_tracker_arguments(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("report", help="merge sweep outputs (e.g. shards), redraw the plot, rewrite summary.csv")
    p.add_argument("outputs", nargs="+", help="sweep output folders")
    p.add_argument("--output_path", default=None,
                   help="where to write the merged views; needed with two or more folders (naming one of "
                        "them writes into it); with one folder, its own views are rewritten in place")
    p.add_argument("--alpha", default="0.05",
                   help=ALPHA_HELP)
    p.add_argument("--peak_step", default=None, help=PEAK_STEP_HELP)
    p.add_argument("--items", action="store_true",
                   help="also write items.csv: one row per checkpoint x task x item with its outcome")
    p.add_argument("--mixed_scorers", action="store_true",
                   help=MIXED_SCORERS_HELP)
    p.add_argument("--compare", action="store_true", help="draw several studies' curves on one plot, OUTPUT_PATH/"
                   "compare.png: sweep output folders, published folders or Hub dataset repos ORG/NAME")
    p.add_argument("--mixed_versions", action="store_true",
                   help="with --compare, draw studies of different dataset or scorer versions instead of refusing")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("experiment", help="the paper's experiments, reproduced")
    experiments = p.add_subparsers(dest="experiment", required=True)
    from .experiments.command import add_parser as add_inversion_parser

    add_experiment_mechanism(experiments)
    add_inversion_parser(experiments)

    from .mitigations.filter import add_parser as add_filter_parser

    add_publish_parser(sub)
    add_filter_parser(sub)
    for p in (parser, *sub.choices.values()):
        p.formatter_class = HelpFormatter
    return parser


# A progress bar that finishes within this many seconds is never drawn (lm-eval's prompt building,
# a tiny model's weight loading): tqdm reads TQDM_DELAY when it is first imported. Yours wins.
PROGRESS_DELAY_S = "2"


def main(argv: list[str] | None = None) -> int:
    if "tqdm" not in sys.modules:
        os.environ.setdefault("TQDM_DELAY", PROGRESS_DELAY_S)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_not_empty(args)
        return args.func(args)
    except UsageError as err:
        print(f"cf-tasks: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("cf-tasks: interrupted; finished files were kept", file=sys.stderr)
        return 130
    except OSError as err:  # a full disk or a read-only folder in any command: one line, exit 1
        return _write_failed(err)


if __name__ == "__main__":
    sys.exit(main())
