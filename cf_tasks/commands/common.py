"""What several commands share: help texts and the checks of the flags they have in common."""

from __future__ import annotations

import argparse
import json

from ..errors import UsageError

ALPHA_HELP = ("significance level of the summary's paired tests: an inversion needs a significant rise and a "
              "significant fall at one peak, Holm-adjusted across the summary's series")
PEAK_STEP_HELP = ("test the rise (first -> peak) and the fall (peak -> final) at this checkpoint step, declared in "
                  "advance (e.g. the peak of another run), on all items; default: the two-lines test over every "
                  "checkpoint, the peak chosen inside its null")
PRIMARY_HELP = ("series or tasks declared primary in advance, comma-separated (e.g. cf_bio): they are adjusted "
                "among themselves only, the other series only after every primary one shows an inversion; "
                "default: Holm across all the summary's series")
NO_KNOWLEDGE_HELP = ("skip the knowledge probe: by default each knowledge-conflict task's items are also asked "
                     "closed-book in the same pass, adding known_rate, known_counterfactual_acc, "
                     "known_parametric_acc and unknown_counterfactual_acc")
ATTENTION_HELP = ("also measure context_attention: the attention of the position that predicts the first answer "
                  "token on the context passage, per knowledge-conflict item (hf models only)")
METADATA_HELP = "JSON passed to the tasks, e.g. '{\"seed\": 7}'"


def add_verdict_arguments(p: argparse.ArgumentParser) -> None:
    """``--alpha``, ``--peak_step`` and ``--primary``, which ``sweep`` and ``report`` share (checked
    by ``parse_alpha``, ``parse_peak_step`` and ``parse_primary``)."""
    p.add_argument("--alpha", default="0.05", help=ALPHA_HELP)
    p.add_argument("--peak_step", default=None, help=PEAK_STEP_HELP)
    p.add_argument("--primary", default=None, help=PRIMARY_HELP)


def task_list(text: str) -> list[str]:
    """``--tasks``: the comma-separated names, blanks dropped."""
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_metadata(text: str | None, check_values: bool = True) -> dict | None:
    """``--metadata``: a JSON object, its Hub copy (``hub_repo``) refused before any model loads and,
    with ``check_values``, the types of its keys (a command whose own checks read them passes False).
    The keys no task of the run reads are checked once the tasks are known
    (``sweep.checks.check_task_metadata``)."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"--metadata is not valid JSON ({err.msg}); pass e.g. '{{\"seed\": 7}}'") from None
    if not isinstance(value, dict):
        raise UsageError("--metadata must be a JSON object, e.g. '{\"seed\": 7}'")
    from ..hub import check_source
    from ..tasks import check_metadata

    try:
        if check_values:
            check_metadata(value, only_ours=False)  # the rest once the tasks are known
        repo, revision = value.get("hub_repo"), value.get("revision")
        # A refused copy is said before any model loads; a value of the wrong type is left to the
        # check of the values, which names it.
        if _text(repo) and (revision is None or _text(revision)):
            check_source(repo, revision)
    except ValueError as err:
        raise UsageError(str(err)) from None
    return value


def _text(value) -> bool:
    return isinstance(value, str) and bool(value.strip())


def parse_alpha(text: str):
    """``--alpha`` of the sweep and the report."""
    from ..sweep import check_alpha

    return check_alpha(text)


def parse_peak_step(text: str | None) -> int | None:
    """``--peak_step`` of the sweep and the report."""
    if text is None:
        return None
    try:
        if not text.strip().isascii():  # int() reads other scripts' digits: "٣" is not a step
            raise ValueError(text)
        return int(text)
    except ValueError:
        raise UsageError(f"--peak_step {text!r} is not a whole number; pass the step of a checkpoint, "
                         "e.g. --peak_step 200") from None


def parse_primary(text: str | None) -> tuple[str, ...]:
    """``--primary`` of the sweep and the report: comma-separated names, none empty."""
    if text is None:
        return ()
    names = [t.strip() for t in text.split(",")]
    if not any(names) or not all(names):
        raise UsageError(f"--primary {text!r}: an empty name; pass series or task names separated by commas, "
                         "e.g. --primary cf_bio")
    return tuple(dict.fromkeys(names))


def check_trackers(args: argparse.Namespace, eval_keys: bool = False) -> dict:
    """``--report_to`` and ``--report_args``."""
    from ..trackers import check

    return check(args.report_to, args.report_args, eval_keys, getattr(args, "output_path", None))
