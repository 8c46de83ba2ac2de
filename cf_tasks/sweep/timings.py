"""Where a sweep's wall time goes (``cf-tasks sweep --timings``): seconds per phase, from the start
of the process to its closing line, printed as a table and written to
``<output>/timings/<UTC time>-<host>-<pid>.json`` (one file per process: shards sharing the folder
each write their own).

The phases follow the sweep's steps: Python's start-up and imports (from the process's start, read
from the operating system where it can be), the checks, the task index, the task settings (each
task loaded once, which builds its dataset), the checkpoints' content ids, rescoring from stored
samples, the model engine's start and each checkpoint's model or adapter load, lm-eval's
evaluation, writing results into the store, and rebuilding the views. What no phase covers is
listed as ``other``."""

from __future__ import annotations

import contextlib
import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path

FOLDER = "timings"
STARTUP = "start-up (Python, imports)"
# The order of the table; a phase that never ran is left out.
PHASES = (STARTUP, "checks", "task index", "task settings (datasets)", "checkpoint ids", "rescoring",
          "model engine and loads", "evaluation", "results into the store", "views", "waiting for others",
          "polling pause")


def process_age() -> float | None:
    """Seconds since this process started (Linux: /proc), or None where that cannot be read."""
    try:
        with open("/proc/self/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time after boot
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return max(0.0, uptime - started)


class Timings:
    """Seconds per phase of one sweep process. ``phase(name)`` times a block and adds it to the
    phase (phases may repeat: one per checkpoint); a phase inside another is taken out of the outer
    one, so that the phases add up to the time they cover."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        age = process_age()
        self.seconds: dict[str, float] = {STARTUP: age} if age is not None else {}
        self.counts: dict[str, int] = {}
        self._stack: list[list] = []  # [name, start, seconds of inner phases]

    @contextlib.contextmanager
    def phase(self, name: str):
        entry = [name, time.perf_counter(), 0.0]
        self._stack.append(entry)
        try:
            yield
        finally:
            self._stack.pop()
            spent = time.perf_counter() - entry[1]
            self.seconds[name] = self.seconds.get(name, 0.0) + spent - entry[2]
            self.counts[name] = self.counts.get(name, 0) + 1
            if self._stack:
                self._stack[-1][2] += spent

    def table(self) -> dict:
        """``{"wall": seconds, "phases": [{"phase", "seconds", "share", "times"}, ...]}``: the wall time
        from the process's start (or from this object's, where that is unknown) to now, each phase's
        seconds and share of it, and ``other`` for the rest."""
        wall = time.perf_counter() - self.started + self.seconds.get(STARTUP, 0.0)
        order = [p for p in PHASES if p in self.seconds] + sorted(set(self.seconds) - set(PHASES))
        rows = [{"phase": p, "seconds": round(self.seconds[p], 3), "times": self.counts.get(p, 1)} for p in order]
        rows.append({"phase": "other", "seconds": round(max(0.0, wall - sum(self.seconds.values())), 3), "times": 1})
        for row in rows:
            row["share"] = round(row["seconds"] / wall, 4) if wall > 0 else 0.0
        return {"wall": round(wall, 3), "phases": rows}

    def format(self, table: dict | None = None) -> str:
        table = table or self.table()
        lines = [f"{'phase':<28} {'seconds':>9} {'share':>7} {'times':>6}"]
        for row in table["phases"]:
            lines.append(f"{row['phase']:<28} {row['seconds']:9.1f} {100 * row['share']:6.1f}% {row['times']:6d}")
        lines.append(f"{'wall (process start to now)':<28} {table['wall']:9.1f}")
        return "\n".join(lines)

    def write(self, out: Path, table: dict | None = None) -> Path:
        """The table as JSON under ``<out>/timings/``, one new file per process (never overwritten)."""
        from ..files import HOST, host_tag, atomic_write

        table = table or self.table()
        folder = Path(out) / FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        path = folder / f"{stamp}-{host_tag(HOST)}-{os.getpid()}.json"
        atomic_write(path, (json.dumps(table, indent=2) + "\n").encode())
        return path
