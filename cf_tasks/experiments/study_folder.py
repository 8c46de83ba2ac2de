"""A study folder's files, shared by both designs of ``cf-tasks experiment inversion``.

Its settings record (``config.json``: the design and every setting that moves a number; a rerun
into the folder must match it), the name of a run's folder (``runs/<arm>-seed<N>``), its JSON, JSON
Lines and CSV files, its wall-time record (``timing.json``), and the small writers of the reports
(Markdown tables, PNG figures). ``StudyError`` is the studies' error for their input (exit 2).
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Iterable

from ..errors import CFTasksError
from ..files import atomic_write


class StudyError(CFTasksError):
    """A problem with the study's input; one line, exit 2."""

    exit_code = 2


def run_name(arm: str, seed: int) -> str:
    return f"{arm}-seed{seed}"


def parse_run_name(name: str) -> tuple[str, int] | None:
    arm, sep, seed = name.rpartition("-seed")
    return (arm, int(seed)) if sep and seed.isdigit() else None


# ------------------------------------------------------------------------------------------ files

def write_jsonl(path: Path, rows: Iterable[dict]) -> None:
    atomic_write(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8"))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def read_csv(path: Path) -> list[dict]:
    """The rows of a CSV file; none for a file that is not there (a part not run yet)."""
    if not Path(path).is_file():
        return []
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def store_json(path: Path, value) -> None:
    atomic_write(Path(path), (json.dumps(value, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def read_timing(out: Path) -> dict:
    path = out / "timing.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def add_time(out: Path, part: str, seconds: float) -> None:
    timing = read_timing(out)
    timing[part] = round(timing.get(part, 0.0) + seconds, 1)
    store_json(out / "timing.json", timing)


# ------------------------------------------------------------------------------- settings record

# What does not move a number: where things are, which runs this invocation adds, how much it prints.
NOT_SETTINGS = frozenset({"output_path", "model", "arms", "seeds", "report_path", "quick", "sweep", "finish"})


def settings_of(cfg) -> dict:
    """The settings of a study config that move its numbers (the model is known by its content)."""
    from dataclasses import asdict

    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items() if k not in NOT_SETTINGS}


def folder_design(out: Path) -> str | None:
    """The design a study folder was made with (its settings record), or None for any other folder."""
    try:
        return json.loads((Path(out) / "config.json").read_text()).get("design")
    except (OSError, ValueError, AttributeError):
        return None


def claim_study_folder(out: Path, record: dict) -> None:
    """Write a study folder's settings record, or refuse a folder made with other settings (a
    ``StudyError``: one line naming the first setting that differs and the fix)."""
    out = Path(out)
    path = out / "config.json"
    if path.is_file():
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError):
            raise StudyError(f"{path} is unreadable; move the folder aside or pass another --output_path") from None
        if old.get("design") != record["design"]:
            raise StudyError(f"{out} holds a study of another design ({old.get('design') or 'an older cf-tasks'}); "
                             "pass another --output_path")
        diff = [k for k in sorted(set(old) | set(record)) if old.get(k) != record.get(k)]
        if diff:
            k = diff[0]
            raise StudyError(f"{out} was made with {k}={old.get(k)!r}, this run asks {record.get(k)!r}; "
                             "pass the same settings or another --output_path")
        return
    out.mkdir(parents=True, exist_ok=True)
    store_json(path, record)


# ------------------------------------------------------------------------------- the sweep's views

def own_views(out: Path, sweeps: Path, scratch: Path, peak_step: int | None = None) -> Path:
    """The folder whose ``sweep.csv`` and ``summary.csv`` hold this study's runs only: ``sweeps``
    itself, or, when its store also holds them at another place (a study folder moved or copied,
    then resumed: same checkpoints, same results, older paths), views made again into ``scratch``
    from the rows of the runs under ``out/runs``, so that each result counts once and the summary's
    tests are adjusted over the study's own series."""
    from ..sweep.views import sweep_rows, write_outputs

    rows = sweep_rows(sweeps)
    runs = (Path(out) / "runs").resolve()
    mine = [r for r in rows if r.get("run") and Path(r["run"]).resolve().parent == runs]
    if len(mine) == len(rows) or not mine:  # (no run under out/runs: the sweep's views as they are)
        return sweeps
    write_outputs(scratch, mine, [], stores=[sweeps], peak_step=peak_step)
    return scratch


# ----------------------------------------------------------------------------------------- report

def save_fig(fig, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    atomic_write(path, buf.getvalue())


def fmt_number(value, digits: int = 3) -> str:
    if value in (None, ""):
        return ""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(x):
        return "nan"
    if x != 0 and abs(x) < 10 ** -digits:
        return f"{x:.1e}"
    text = f"{x:.{digits}f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def md_table(rows: list[dict], columns: Iterable[str]) -> str:
    columns = list(columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(fmt_number(r.get(c)) if c not in ("run", "task", "verdict", "kind", "what", "part")
                                      else str(r.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)
