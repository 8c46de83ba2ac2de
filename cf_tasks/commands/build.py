"""``cf-tasks build``: the counterfactual datasets (or, with ``--for_training``, training points) to files."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ..errors import UsageError
from ..files import OutputLock, ascii_int, writable_dir


def add_parser(sub) -> None:
    from dataset_builders import DEFAULT_SEED
    from dataset_builders.serialize import FORMATS

    p = sub.add_parser("build", help="build the counterfactual datasets (or training points) to files")
    p.add_argument("--dataset", default="all", help="dataset name or 'all' (default)")
    p.add_argument("--seed", type=ascii_int, default=DEFAULT_SEED, help=f"builder seed (default {DEFAULT_SEED})")
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
    p.set_defaults(func=run)


def run_training(args: argparse.Namespace) -> int:
    """``cf-tasks build --for_training``: training points of the training part (C, CS, S, CF)."""
    from dataset_builders.training import DEFAULT_KINDS, TRAINING_FORMATS, TrainingDataError, export, parse_kinds

    fmt = args.format or TRAINING_FORMATS[0]
    if fmt not in TRAINING_FORMATS:
        raise UsageError(f"--format {fmt} does not apply to --for_training; choose {' or '.join(TRAINING_FORMATS)}")
    if args.dataset != "all":
        raise UsageError("--dataset does not apply to --for_training; choose the points with --kinds")
    from dataset_builders.serialize import check_manifest_owner, prior_entries
    from dataset_builders.training import manifest_settings

    try:
        kinds = parse_kinds(args.kinds) if args.kinds is not None else DEFAULT_KINDS
        check_manifest_owner(Path(args.out), "kinds")
        settings = manifest_settings(fmt, args.seed)
        prior_entries(Path(args.out), "kinds", settings, set(kinds))  # refused before any work
    except ValueError as err:
        raise UsageError(str(err)) from None
    out = writable_dir(args.out)
    try:
        with OutputLock(out, "build", on_folder=True):  # one build per folder: each keeps the other's record
            manifest = export(kinds, fmt, args.seed, out, prior_entries(out, "kinds", settings, set(kinds)))
    except TrainingDataError as err:
        raise UsageError(f"training points broke a rule:\n{err}\nfix the fact table or builder named above") from None
    except ValueError as err:  # another build of other settings landed there since the check
        raise UsageError(str(err)) from None
    if not args.quiet:
        for kind, entry in manifest["kinds"].items():
            families = ", ".join(f"{f} {n}" for f, n in entry["families"].items())
            print(f"{kind:3s} {entry['count']:6d} points ({families})  {out / entry['file']}")
        print(f"training points in {fmt} format, seed {args.seed}, split seed {manifest['split_seed']} "
              f"-> {out / 'manifest.json'}")
    return 0


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    import dataset_builders
    from dataset_builders.serialize import FORMATS, check_manifest_owner, prior_entries, sha256, write_dataset
    from dataset_builders.validate import ValidationError, build_validated

    from ..files import atomic_write

    if args.for_training:
        return run_training(args)
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
        prior_entries(Path(args.out), "datasets", {"seed": args.seed, "format": args.format}, set(names))
    except ValueError as err:
        raise UsageError(str(err)) from None
    out = writable_dir(args.out)
    with OutputLock(out, "build", on_folder=True):  # one build per folder: each keeps the other's record
        try:
            keep = prior_entries(out, "datasets", {"seed": args.seed, "format": args.format}, set(names))
        except ValueError as err:  # another build of other settings landed there since the check
            raise UsageError(str(err)) from None
        # an earlier build of the same settings keeps its record beside this one's
        manifest = {"seed": args.seed, "format": args.format, "datasets": dict(keep)}
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
        for name, entry in ((n, manifest["datasets"][n]) for n in names):
            print(f"{name:16s} {entry['count']:6d} items  v{entry['version']}  {out / entry['file']}")
        print(f"built {len(names)} dataset(s) with seed {args.seed} in {elapsed:.2f} s -> {out / 'manifest.json'}")
    return 0
