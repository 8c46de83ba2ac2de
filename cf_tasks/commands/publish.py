"""``cf-tasks publish``: every dataset in the Hub layout, uploaded (or, with ``--dry_run``, written to a
folder); with ``--results``, a sweep's results instead.

A ``PublishError`` raised once the Hub token is read has the token taken out of its text.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from ..files import ascii_int, writable_dir


def add_parser(sub) -> None:
    from dataset_builders import DEFAULT_SEED

    p = sub.add_parser("publish", help="build every dataset and publish it as a Hub dataset repository")
    p.add_argument("--repo_id", "--repo-id", required=True, help="Hub dataset repository, ORG/NAME")
    p.add_argument("--private", action="store_true", help="create the repository as private")
    p.add_argument("--revision", default="main", help="branch to commit to")
    p.add_argument("--seed", type=ascii_int, default=DEFAULT_SEED, help="builder seed")
    p.add_argument("--dry_run", "--dry-run", action="store_true", help="write the repository layout to --out; upload nothing")
    p.add_argument("--out", "--output_path", dest="out", default=None, help="folder for the layout (required with --dry_run)")
    p.add_argument("--results", default=None, help="a sweep output folder: publish its results (sweep.csv, summary.csv, "
                   "items.csv, the plot, the settings) instead of the datasets")
    p.add_argument("--quiet", action="store_true", help="no progress or summary output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Export every dataset in the Hub layout, then upload it (unless --dry_run)."""
    from .. import hub
    from ..hub import PublishError

    if args.results:
        return run_results(args)
    hub.check_repo_id(args.repo_id)
    if args.dry_run and not args.out:
        raise PublishError("--dry_run needs --out DIR, the folder to export to")
    if args.dry_run and (Path(args.out) / "sweep.csv").is_file():  # its card would merge into the datasets'
        raise PublishError(f"--out {args.out} holds a sweep's results (sweep.csv); pass a new folder")
    token = None if args.dry_run else hub.get_token()
    if not args.dry_run:
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:  # said before building anything
            raise PublishError("the Hugging Face Hub is switched off (HF_HUB_OFFLINE is set); unset HF_HUB_OFFLINE "
                               "to publish, or export with --dry-run --out DIR")
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
        raise PublishError(hub.redact(str(err), token)) from None
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


def run_results(args: argparse.Namespace) -> int:
    """``cf-tasks publish --results SWEEP_OUT --repo_id ORG/NAME [--dry_run --output_path DIR]``: a
    finished sweep as a Hub dataset (``cf_tasks.sweep.publish``)."""
    from .. import hub
    from ..hub import PublishError
    from ..sweep.publish import check_dry_run_target, export_results, upload_folder, write_dry_run

    results = Path(args.results)
    token = None
    hub.check_repo_id(args.repo_id)
    if not results.is_dir() or not (results / "sweep.csv").is_file():
        raise PublishError(f"--results {results}: not a sweep output folder (no sweep.csv); pass the "
                           "--output_path of a cf-tasks sweep or report")
    if args.dry_run and not args.out:
        raise PublishError("--dry_run needs --output_path DIR, the folder to write the repository to")
    if not args.dry_run:
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            raise PublishError("the Hugging Face Hub is switched off (HF_HUB_OFFLINE is set); unset it to "
                               "publish, or write the folder with --dry_run --output_path DIR")
        token = hub.get_token()
    if args.dry_run:
        check_dry_run_target(results, Path(args.out))
        target = writable_dir(args.out)
    try:
        with tempfile.TemporaryDirectory(prefix="cf-tasks-publish-") as tmp:
            if args.dry_run:  # the repository's files land as one set
                counts, where = write_dry_run(results, target, args.repo_id), str(target)
            else:
                counts = export_results(results, Path(tmp), args.repo_id)
                commit = upload_folder(Path(tmp), args.repo_id, token, args.private, args.revision)
                where = f"https://huggingface.co/datasets/{args.repo_id} ({getattr(commit, 'oid', '?')})"
    except PublishError as err:
        raise PublishError(hub.redact(str(err), token)) from None
    if not args.quiet:
        print(", ".join(f"{name} {n} rows" for name, n in counts.items()) + f" -> {where}", file=sys.stderr)
    return 0
