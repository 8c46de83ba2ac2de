"""``cf-tasks report --compare A B ...``: several studies' curves on one plot.

A study is a sweep output folder, a folder written by ``cf-tasks publish --results --dry_run``, or a
published Hub dataset repository (``ORG/NAME``, read with huggingface_hub). Each study's sweep.csv
rows are drawn in a colour of their own: counterfactual accuracy solid, parametric accuracy dashed,
one panel per task. Rows of one task scored under different task (dataset) versions or scorer
versions follow different rules, so such a comparison is refused in one line unless
``--mixed_versions`` is passed. Writes ``compare.png`` and ``compare.csv`` (the rows, with a ``study``
column) into ``--output_path``."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from ..files import atomic_write, writable_dir
from ..results import rows_to_csv
from .config import SweepError
from .views import SWEEP_COLUMNS

METRICS = {"counterfactual_acc": "-", "parametric_acc": "--"}
MC_METRICS = {"context_prob": "-", "acc": "--"}  # a multiple-choice task's curves, where it has no generation
PLOT = "compare.png"
TABLE = "compare.csv"


def _number(text):
    if text in (None, ""):
        return None
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() and "." not in str(text) else value


def read_study(source: str) -> tuple[str, list[dict]]:
    """(label, sweep.csv rows) of a local folder or a Hub dataset repository."""
    folder = Path(source).expanduser()
    if not folder.is_dir():
        if source.count("/") != 1 or source.startswith((".", "/", "~")):
            raise SweepError(f"{source}: no such folder; pass a sweep output folder or a Hub dataset repo ORG/NAME")
        try:
            from huggingface_hub import hf_hub_download

            folder = Path(hf_hub_download(source, "sweep.csv", repo_type="dataset")).parent
        except Exception as err:  # offline, unknown repo, no access: one line
            from ..hub import redact

            reason = redact(" ".join(str(err).split())[:200]) or type(err).__name__
            raise SweepError(f"{source}: cannot read the published study ({type(err).__name__}: {reason}); check the "
                             "repo id and the network (HF_HUB_OFFLINE), or pass a local folder") from None
    path = folder / "sweep.csv"
    if not path.is_file():
        raise SweepError(f"{source}: no sweep.csv; pass a folder written by cf-tasks sweep, report or publish")
    with path.open(newline="") as fh:
        rows = [{k: _number(v) if k in ("step", "value", "stderr", "n", "version", "scorer_version", "limit") else v
                 for k, v in r.items()} for r in csv.DictReader(fh)]
    return source.rstrip("/").split("/")[-1] if folder == Path(source).expanduser() else source, rows


def check_versions(studies: list[tuple[str, list[dict]]], mixed: bool) -> None:
    """Refuse (one line) a task whose studies were scored under different dataset or scorer versions."""
    if mixed:
        return
    for field, what in (("version", "dataset (task) versions"), ("scorer_version", "scorer versions")):
        seen: dict[str, dict] = {}
        for label, rows in studies:
            for r in rows:
                seen.setdefault(r["task"], {}).setdefault(str(r.get(field) or "none"), label)
        for task, versions in sorted(seen.items()):
            if len(versions) > 1:
                found = ", ".join(f"{v} in {label}" for v, label in sorted(versions.items()))
                raise SweepError(f"{task}: the studies were scored under different {what} ({found}); compare studies "
                                 "of one version, or pass --mixed_versions to draw them anyway")


def draw_studies(studies: list[tuple[str, list[dict]]]):
    """The figure: one panel per task, a colour per study; returns (figure, the labels of the lines drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for _, rows in studies for r in rows if r["metric"] in METRICS})
    metrics = METRICS
    if not tasks:
        tasks, metrics = sorted({r["task"] for _, rows in studies for r in rows if r["metric"] in MC_METRICS}), MC_METRICS
    if not tasks:
        raise SweepError("the studies have no counterfactual_acc or context_prob rows to draw; pass sweep outputs of "
                         "knowledge-conflict tasks")
    fig, axes = plt.subplots(1, len(tasks), figsize=(max(6.0, 4.6 * len(tasks)), 3.8), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = []
    for ax, task in zip(axes[0], tasks):
        for i, (label, rows) in enumerate(studies):
            for metric, style in metrics.items():
                pts = sorted((r["step"], r["value"]) for r in rows if r["task"] == task and r["metric"] == metric
                             and r.get("step") not in (None, "") and r.get("value") is not None)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", color=colours[i % len(colours)],
                            label=f"{label}: {metric}")
                    drawn.append(f"{task} {label}: {metric}")
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("accuracy")
    fig.tight_layout()
    return fig, drawn


def plot_studies(studies: list[tuple[str, list[dict]]], path: Path) -> list[str]:
    """The figure written to ``path``; returns the labels of the lines drawn."""
    fig, drawn = draw_studies(studies)  # chooses matplotlib's file-only backend before pyplot loads
    import matplotlib.pyplot as plt

    png = io.BytesIO()
    try:
        fig.savefig(png, dpi=110, format="png")
    finally:
        plt.close(fig)
    atomic_write(path, png.getvalue())
    return drawn


def compare(sources: list[str], target: Path, mixed_versions: bool = False) -> tuple[list[tuple[str, list[dict]]], list[str]]:
    """The studies read, checked and drawn into ``target``: (the studies, the lines drawn)."""
    if len(sources) < 2:
        raise SweepError("--compare needs two or more studies; pass e.g. report --compare SWEEP_A SWEEP_B --output_path DIR")
    seen: dict = {}
    for s in sources:  # one study twice would draw its lines twice and count its rows twice
        key = Path(s).expanduser().resolve() if Path(s).expanduser().is_dir() else s.rstrip("/")
        if key in seen:
            raise SweepError(f"--compare: {s} is given twice (as {seen[key]}); pass each study once")
        seen[key] = s
    studies = [read_study(s) for s in sources]
    labels = [label for label, _ in studies]
    if len(set(labels)) < len(labels):  # two folders of one name: their whole paths tell them apart
        studies = [(s, rows) for s, (_, rows) in zip(sources, studies)]
    check_versions(studies, mixed_versions)
    target = writable_dir(str(target), "--output_path")  # made only once the studies are read and checked
    drawn = plot_studies(studies, target / PLOT)
    table = [{"study": label, **r} for label, rows in studies for r in rows]
    atomic_write(target / TABLE, rows_to_csv(table, ("study", *SWEEP_COLUMNS)))
    return studies, drawn
