"""``cf-tasks publish --results SWEEP_OUT``: a finished sweep as a Hub dataset others can load.

The repository holds the sweep's own tables as configs ``datasets.load_dataset`` reads (``sweep``:
sweep.csv, one row per checkpoint x task x metric; ``summary``: summary.csv, one row per series with
its verdict; ``items``: items.csv, one row per checkpoint x task x item), the plot, ``settings.json``
(models, tasks and their versions, scorer version, limit, every setting a result was stored under)
and a card that says how the study was made. The CSV files are the sweep's bytes, so a loaded config
has sweep.csv's rows. ``--dry_run --output_path DIR`` writes the same folder locally; an upload is one
commit. The Hub token is read by huggingface_hub and never written or printed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..files import atomic_write
from . import store
from .config import SweepError
from .stats import ITEM_COLUMNS, item_rows
from .views import ITEMS, SUMMARY, sweep_rows
from ..results import rows_to_csv

CONFIGS = {"sweep": "sweep.csv", "summary": SUMMARY, "items": ITEMS}
PLOT = "inversion.png"
SETTINGS = "settings.json"
SPLIT = "train"


def settings_of(out: Path, rows: list[dict]) -> dict:
    """What the study was made with: models, tasks with their versions, scorer versions, limits and
    every stored setting, from the store (or, without one, from the rows)."""
    from ..hub import redact

    records = store.read_store(out)[0] if (out / store.STORE).is_dir() else []
    hashes = {r.get("settings") for r in rows}
    by_hash = {r["settings_hash"]: r["settings"] for r in records if r["settings_hash"] in hashes}
    tasks: dict[str, dict] = {}
    for r in rows:
        t = tasks.setdefault(r["task"], {"versions": set(), "scorer_versions": set(), "limits": set()})
        t["versions"].add(r.get("version"))
        t["scorer_versions"].add(r.get("scorer_version"))
        t["limits"].add(r.get("limit"))
    value = {
        "models": sorted({str(r.get("model")) for r in rows if r.get("model")}),
        "checkpoints": len({(r.get("run"), r["checkpoint"]) for r in rows}),
        "steps": sorted({r["step"] for r in rows if r.get("step") is not None}),
        "tasks": {name: {k: sorted(v, key=str) for k, v in t.items()} for name, t in sorted(tasks.items())},
        "settings": by_hash,
    }
    return json.loads(redact(json.dumps(value, sort_keys=True, default=str)))


def card(repo_id: str, settings: dict, summary: list[dict], counts: dict[str, int]) -> str:
    """README.md: the configs in the card's YAML, then how the study was made and how to load it."""
    import importlib.metadata

    import yaml

    try:
        version = importlib.metadata.version("cf-tasks")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    meta = {"configs": [{"config_name": name, "data_files": [{"split": SPLIT, "path": f}],
                         **({"default": True} if name == "sweep" else {})} for name, f in CONFIGS.items()
                         if counts.get(name)],  # a table with no row is shipped, not declared: it cannot load
            "tags": ["cf-tasks", "knowledge-conflict", "context-parametric-inversion", "evaluation-results"],
            "license": "mit"}
    lines = ["---", yaml.safe_dump(meta, sort_keys=False).strip(), "---", "",
             f"# {repo_id.split('/')[-1]}: counterfactual accuracy over fine-tuning checkpoints", "",
             "Results of `cf-tasks sweep`, which scores every checkpoint of a fine-tuning run on knowledge-conflict "
             "tasks: a context states a counterfactual answer, and the model answers from the context "
             "(`counterfactual_acc`) or from memory (`parametric_acc`). A rise then a fall of counterfactual accuracy "
             "is the context-parametric inversion of *Context-Parametric Inversion: Why Instruction Finetuning May Not "
             "Actually Improve Context Reliance* (Goyal et al., ICLR 2025).", "",
             f"Made with cf-tasks {version}: {settings['checkpoints']} checkpoints, steps "
             f"{', '.join(map(str, settings['steps'])) or 'none'}; models: "
             f"{', '.join(Path(m).name for m in settings['models']) or 'unknown'}.", "",
             "| task | task version | scorer version | limit |", "| --- | --- | --- | --- |"]
    for name, t in settings["tasks"].items():
        lines.append(f"| `{name}` | {', '.join(map(str, t['versions']))} | {', '.join(map(str, t['scorer_versions']))} "
                     f"| {', '.join(map(str, t['limits']))} |")
    lines += ["", "Every setting a result was stored under (model arguments, chat template, seeds) is in "
              f"`{SETTINGS}`. Scores of different task or scorer versions follow different rules and are not "
              "comparable.", "", "## Configs", "", "| config | rows | file |", "| --- | ---: | --- |"]
    lines += [f"| `{name}` | {counts[name]} | `{CONFIGS[name]}` |" for name in CONFIGS if name in counts]
    if summary:
        lines += ["", "## Verdicts", "", "| series | peak step | first | peak | final | verdict |",
                  "| --- | ---: | ---: | ---: | ---: | --- |"]
        lines += [f"| {s.get('series')} | {s.get('peak_step')} | {s.get('first')} | {s.get('peak')} | {s.get('final')} "
                  f"| {s.get('verdict')} |" for s in summary]
    lines += ["", "## Loading", "", "```python", "from datasets import load_dataset", "",
              f'rows = load_dataset("{repo_id}", "sweep", split="{SPLIT}")', "```", "",
              "To draw these curves beside another study's:", "", "```bash",
              f"cf-tasks report --compare {repo_id} MY_SWEEP_OUT --output_path compare/", "```", "",
              f"![curves]({PLOT})", ""]
    return "\n".join(lines)


def export_results(results: Path, out: Path, repo_id: str) -> dict[str, int]:
    """The repository's files written to ``out``; returns the rows per config."""
    import csv

    if not (results / "sweep.csv").is_file():
        raise SweepError(f"--results {results}: no sweep.csv; pass a folder written by cf-tasks sweep or report")
    rows = sweep_rows(results) if (results / store.STORE).is_dir() else \
        json.loads((results / "sweep.json").read_text())["rows"] if (results / "sweep.json").is_file() else []
    if not (results / ITEMS).is_file() and rows:
        atomic_write(out / ITEMS, rows_to_csv(item_rows(rows, [results]), ITEM_COLUMNS))
    counts = {}
    for name, file in CONFIGS.items():
        src = results / file
        if src.is_file():
            shutil.copyfile(src, out / file)
        if (out / file).is_file():
            with (out / file).open(newline="") as fh:
                counts[name] = sum(1 for _ in csv.DictReader(fh))
    if (results / PLOT).is_file():
        shutil.copyfile(results / PLOT, out / PLOT)
    settings = settings_of(results, rows)
    atomic_write(out / SETTINGS, (json.dumps(settings, indent=2, sort_keys=True) + "\n").encode())
    summary = list(csv.DictReader((out / SUMMARY).open())) if (out / SUMMARY).is_file() else []
    atomic_write(out / "README.md", card(repo_id, settings, summary, counts).encode())
    return counts


def upload_folder(out: Path, repo_id: str, token: str, private: bool, revision: str):
    from huggingface_hub import CommitOperationAdd, HfApi

    from ..hub import hub_error

    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, repo_type="dataset", private=True if private else None, exist_ok=True)
        if revision != "main":
            api.create_branch(repo_id, branch=revision, repo_type="dataset", exist_ok=True)
        ops = [CommitOperationAdd(path_in_repo=p.name, path_or_fileobj=str(p)) for p in sorted(out.iterdir())
               if p.is_file()]
        return api.create_commit(repo_id, ops, repo_type="dataset", revision=revision,
                                 commit_message="cf-tasks: publish sweep results")
    except OSError as err:
        raise hub_error("upload to", repo_id, err, token) from None


# ------------------------------------------------------------------------- a dry run's folder

DRY_RUN_NAMES = frozenset({*CONFIGS.values(), PLOT, SETTINGS, "README.md"})


def check_dry_run_target(results: Path, target: Path) -> None:
    """``--dry_run --output_path``: a folder that is neither the sweep folder read, nor inside it, nor
    another sweep's output folder, whose tables the repository's files would replace (exit 2)."""
    if target.exists() and not target.is_dir():
        raise SweepError(f"--output_path {target} is a file, not a folder; pass a folder (it is created if missing)")
    src, dest = results.resolve(), target.expanduser().resolve()
    if dest == src or src in dest.parents:
        raise SweepError(f"--output_path {target} is the sweep folder read (--results {results}) or inside it, whose "
                         "tables it would replace; pass a new folder")
    if (target / store.STORE).is_dir() or (target / "manifest.json").is_file():
        raise SweepError(f"--output_path {target} holds a sweep's results, whose tables the repository's files would "
                         "replace; pass a new folder (or the folder of an earlier dry run)")
    if (target / "data").is_dir():
        raise SweepError(f"--output_path {target} holds a dataset export (data/), whose card the repository's card "
                         "would replace; pass a new folder (or the folder of an earlier dry run of a sweep)")


def write_dry_run(results: Path, target: Path, repo_id: str) -> dict[str, int]:
    """The repository's files written to ``target`` as one set: one dry run at a time (a lock on the
    folder itself, so that it holds the repository's files only), staged inside it, the files of an
    earlier dry run that this one does not write removed, ``settings.json`` last."""
    from ..files import OutputLock, clean_stages, publish, stage_dir

    with OutputLock(target, "publish", on_folder=True):
        clean_stages(target, "publish")
        stage = stage_dir(target, "publish")
        try:
            counts = export_results(results, stage, repo_id)
            settings = json.loads((stage / SETTINGS).read_text())
            (stage / SETTINGS).unlink()
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
        publish(stage, target, SETTINGS, settings, set(DRY_RUN_NAMES))
    return counts
