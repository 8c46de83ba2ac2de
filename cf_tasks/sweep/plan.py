"""Running a sweep: the loop that plans each round (which checkpoints of this process's shard the
store lacks results for, which it can rescore from stored samples), scores each under its claim,
writes its results into the store, rebuilds the views and says what the run did. The checks
before any model loads are in ``checks``, the settings of each task in ``settings``, the shard and
the places of the checkpoints in ``selection``."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

from ..checkpoints import NAME_FORMS, Checkpoint, CheckpointError, check_weights, discover, settled, skipped
from ..evaluate import quiet_upstream
from ..files import HOST, write_failure
from ..known import probe_for
from ..scoring import SCORER_VERSION
from . import locks, store, upstream
from .checks import (check_arguments, check_bases, check_peak_step_planned, check_primary_planned, pip_line,
                     vllm_available, vllm_missing)
from .config import SweepConfig, SweepError
from .hf import HFBackend
from .rescore import NotReplayable, rescore, source_for
from .selection import base_checkpoint, place_of, select_shard
from .settings import task_settings
from .store import split_results
from .timings import Timings
from .views import format_summary, rebuild_views, sweep_rows
from ..trackers import TrackerError
from ..trackers import check as check_trackers
from ..trackers.reporter import Reporter

# The views (sweep.csv, the plot, the summary) are rebuilt after a scored checkpoint once this many
# seconds have passed since their last rebuild, at the end of each --watch round and at the end:
# a LoRA group's mates finish seconds after its first member, and one rebuild serves them all.
VIEWS_EVERY = 60.0


def make_backend(cfg: SweepConfig, checkpoints: list[Checkpoint], model_args: dict):
    """The backend of ``cfg``, loading models with ``model_args`` (``sweep_model_args``, computed
    once by the plan), after checking that lm-eval's and vLLM's hooks it relies on still have their
    tested shape (``upstream.check``); no model loads here."""
    if cfg.backend == "vllm" and not vllm_available():
        raise SweepError(vllm_missing("--backend"))
    try:
        upstream.check(cfg.backend)
    except ImportError as err:
        raise SweepError(f"a Python package is missing ({err}); {pip_line(err.name)}") from None
    if cfg.backend == "vllm":
        from .vllm import VLLMBackend

        return VLLMBackend(cfg, checkpoints, model_args)
    return HFBackend(cfg, model_args)


def _result_record(cid: str, task: str, settings: dict, hashes: dict, seconds: float, place: dict, **extra) -> dict:
    return {"id": cid, "task": task, "settings": settings[task], "settings_hash": hashes[task],
            "seconds": round(seconds, 3), "finished": time.time(), "scored_at": place, "host": HOST,
            "pid": os.getpid(), **extra}


def _with_probe_samples(part: dict, results: dict, task_settings: dict) -> dict:
    """A task's part of the results with the samples of its knowledge probe's closed-book tasks,
    so that the stored result can be rescored from its samples alone."""
    part.pop("probe_samples", None)
    kept = results.get("probe_samples") or {}
    for closed in (task_settings.get("knowledge") or {}).values():
        if closed in kept and "samples" in part:
            part["samples"][closed] = kept[closed]
    return part


def _changed_while_scored(c: Checkpoint, cid: str, out: Path) -> str | None:
    """The checkpoint's content id computed again after scoring: a checkpoint re-saved while it was
    loaded or scored is not stored under the id of the content it had before (one line; the next
    sweep scores what is there then)."""
    try:
        now = store.checkpoint_identity(c.path, c.kind, c.base, cache=out)
    except OSError as err:
        return f"{c.path}: changed while it was scored ({err.strerror or type(err).__name__}); not stored, run again"
    if now == cid:
        return None
    return (f"{c.path}: re-saved while it was scored (content id {cid} before, {now} after); its results were not "
            "stored; run the sweep again once it is written (--watch waits for it)")


def describe_settings(cfg: SweepConfig, settings: dict[str, dict]) -> str:
    """The settings a result is stored under, in the flags' words (the closing line's)."""
    some = next(iter(settings.values()), {})
    model_args = ",".join(f"{k}={v}" for k, v in (some.get("model_args") or {}).items())
    parts = [f"tasks {','.join(settings)}",
             f"--limit {some['limit']}" if some.get("limit") is not None else "no --limit",
             f"--backend {cfg.backend}", f"--model_args {model_args}" if model_args else "",
             "chat template on" if cfg.apply_chat_template else "chat template off",
             "knowledge probe on" if any("knowledge" in s for s in settings.values()) else "knowledge probe off",
             "--attention" if any("attention" in s for s in settings.values()) else "",
             f"--metadata {json.dumps(cfg.metadata, sort_keys=True)}" if cfg.metadata else ""]
    return ", ".join(p for p in parts if p)


def closing_line(cfg: SweepConfig, out: Path, settings: dict[str, dict], scored: int, reused: int,
                 failed: int) -> str:
    """One line: what this run did with each checkpoint it looked at."""
    total = scored + reused + failed
    line = f"sweep: {total} checkpoint{'' if total == 1 else 's'}: {scored} scored, {reused} reused"
    if reused:
        line += f" (already in {out} under these settings: {describe_settings(cfg, settings)})"
    return f"{line}, {failed} failed"


@contextlib.contextmanager
def _hushed(quiet: bool):
    """With --quiet: what lm-eval, transformers and the bars print while a checkpoint is scored
    goes nowhere (a failure is still reported, by the sweep, afterwards)."""
    if not quiet:
        yield
        return
    with open(os.devnull, "w") as null, contextlib.redirect_stderr(null), contextlib.redirect_stdout(null):
        yield


class SweepRun:
    """One sweep, as its steps. ``SweepRun(cfg)`` makes the checks that need no model, builds the
    task settings and prepares the output folder; each round, ``plan_round`` lists the checkpoints
    this process scores now (rescoring from stored samples and reusing stored results first) and
    ``score`` puts one checkpoint's results into the store; ``finish`` writes the views and says what
    the run did. ``run_sweep`` is the loop over these."""

    def __init__(self, cfg: SweepConfig, log=print, timings: Timings | None = None):
        self.cfg, self.log = cfg, log
        self.timings = timings or Timings()  # seconds per phase (printed and written with --timings)
        phase = self.timings.phase
        with phase("checks"):
            self.run_dir, self.out, self.model_args = check_arguments(cfg)
            try:  # --report_to, --report_args: a tracker that is not installed names its extra
                self.reporter = Reporter(check_trackers(cfg.report_to, cfg.report_args, out=self.out), self.out, log)
            except TrackerError as err:
                raise SweepError(str(err)) from None
        self.told: set[Path] = set()  # skipped names already listed
        found = [] if cfg.watch else discover(self.run_dir, cfg.base)  # --watch looks in its rounds
        if not cfg.watch and not found:
            count = self.tell_skipped()
            listed = f"; {count} skipped name(s) listed above" if count else ""
            raise SweepError(f"{self.run_dir}: no checkpoint folders ({NAME_FORMS}){listed}; "
                             "point RUN_DIR at the training output folder")
        check_bases(found, cfg.base)
        if not cfg.watch:
            check_peak_step_planned(cfg, self.run_dir)
        with phase("task index"):
            from ..evaluate import needs_builtin_tasks
            from ..registry import task_manager

            self.tm = task_manager(include_defaults=needs_builtin_tasks(cfg.tasks), metadata=cfg.metadata)
        with phase("task settings (datasets)"):
            self.settings = task_settings(cfg, self.tm, self.model_args)
        check_primary_planned(cfg, self.settings)
        self.hashes = {t: store.settings_hash(s) for t, s in self.settings.items()}
        self.claim_key = store.settings_hash(self.hashes)
        try:  # a tracker run that holds a task under other settings would mix two curves
            self.reporter.check_settings(self.hashes)
        except TrackerError as err:
            raise SweepError(str(err)) from None
        try:
            # store/ from the start: a run that selects no checkpoint (a shard beyond the checkpoints,
            # a --watch stopped before the first save) leaves a folder that the next sweep accepts.
            (self.out / store.STORE).mkdir(parents=True, exist_ok=True)
            store.clean_leftovers(self.out, cfg.lock_timeout)
        except OSError as err:
            raise SweepError(f"--output_path {self.out}: {err.strerror or type(err).__name__}; "
                             "pass a writable folder") from None
        self.backend = None
        self.failed: dict[str, str] = {}  # place -> its error, once per run
        self.scored: set[str] = set()  # checkpoint places this run scored a result for
        self.reused: set[str] = set()  # places whose results were all in the store already
        self.views_stale = False  # results stored since the views' last rebuild
        self.views_at = time.monotonic()

    def tell_skipped(self) -> int:
        """One line per name that looks like a checkpoint but is not scored (once per run)."""
        found = skipped(self.run_dir)
        for path, reason in found:
            if path not in self.told:
                self.told.add(path)
                self.log(f"cf-tasks: skipped {path}: {reason}", file=sys.stderr)
        return len(found)

    def fail(self, place: dict, error: str) -> None:
        if self.failed.get(place["place"]) != error:  # once per run, not once per poll
            self.log(f"cf-tasks: error: {error}", file=sys.stderr)
            store.record_failure(self.out, place, error)
        self.failed[place["place"]] = error

    def succeed(self, place: dict, reused: bool) -> None:
        if reused:
            self.reused.add(place["place"])
        self.failed.pop(place["place"], None)
        store.clear_failure(self.out, place["place"])

    def missing(self, cid: str) -> list[str]:
        """The tasks whose result for this checkpoint, under this run's settings, the store lacks."""
        return [t for t in self.settings if not store.has_result(self.out, cid, t, self.hashes[t])]

    def rescore_from_samples(self, cid: str, place: dict) -> None:
        """The missing results that a stored result of another scorer version can give (no model)."""
        cfg, settings, hashes = self.cfg, self.settings, self.hashes
        todo = self.missing(cid)
        if not todo:
            return
        records = [r for r in store.read_results(self.out, cid) if r["task"] in todo]
        for task in todo:
            source = source_for([r for r in records if r["task"] == task], settings[task])
            if source is None and not settings[task].get("attention"):  # a damaged result's surviving samples
                source = next(({"dir": str(d), "settings": settings[task], "settings_hash": hashes[task]}
                               for d in store.damaged_sources(self.out, cid, task, hashes[task])), None)
            if source is None:
                continue
            start = time.perf_counter()
            probe = probe_for(settings[task]["num_fewshot"]) if cfg.knowledge else None
            try:
                results = rescore(source, task, self.tm, cfg.limit, cfg.apply_chat_template, cfg.metadata, probe)
            except NotReplayable as err:
                self.log(f"cf-tasks: {place['name']} {task}: evaluated again, not rescored ({err})", file=sys.stderr)
                continue
            seconds = time.perf_counter() - start
            part = _with_probe_samples(split_results(results, task), results, settings[task])
            record = _result_record(cid, task, settings, hashes, seconds, place, rescored_from=source["settings_hash"])
            store.write_result(self.out, cid, task, hashes[task], record, part)
            if source["settings_hash"] == hashes[task]:
                self.log(f"cf-tasks: {place['name']} {task}: rescored from the samples of its damaged result in "
                         f"{seconds:.1f} s, no model loaded", file=sys.stderr)
                continue
            self.log(f"cf-tasks: {place['name']} {task}: rescored from stored samples (scorer version "
                     f"{(source['settings'] or {}).get('scorer_version', 'none')} -> {SCORER_VERSION}) in "
                     f"{seconds:.1f} s, no model loaded", file=sys.stderr)

    def plan_round(self) -> list[tuple[Checkpoint, dict, str]]:
        """The checkpoints of this shard to score now, as (checkpoint, place, content id). Those whose
        results are all stored (or can be rescored from stored samples) are reused, not listed;
        failures (a broken checkpoint, an unreadable file) are reported and not listed."""
        cfg = self.cfg
        checkpoints = discover(self.run_dir, cfg.base)
        self.tell_skipped()
        if cfg.include_base:
            base = base_checkpoint(cfg, checkpoints)
            if base is None:
                raise SweepError("--include_base needs a base model: pass --base MODEL (or sweep LoRA adapters)")
            checkpoints = [base, *checkpoints]
        selected = select_shard(checkpoints, cfg.shard)
        if cfg.watch:
            selected = [c for c in selected if c.kind == "base" or c.error or settled(c, cfg.settle_seconds)]
            selected = [c for c in selected if not (c.error and "still being written" in c.error)]
        todo = []
        for c in selected:
            place = place_of(self.run_dir, c)
            if c.error:
                self.fail(place, c.error)
                continue
            try:
                with self.timings.phase("checkpoint ids"):
                    cid = store.checkpoint_identity(c.path, c.kind, c.base, cache=self.out)
            except OSError as err:
                self.fail(place, f"{c.path}: cannot read the checkpoint ({err.strerror or type(err).__name__}); "
                          "fix its permissions")
                continue
            place["id"] = cid
            store.note_place(self.out, cid, place)
            with self.timings.phase("rescoring"):
                self.rescore_from_samples(cid, place)
            if self.missing(cid):
                todo.append((c, place, cid))
            else:
                self.succeed(place, reused=True)
        return todo

    def score_all(self, todo: list[tuple[Checkpoint, dict, str]]) -> int:
        """Score the planned checkpoints in turn (one backend for the whole run, made on first need);
        returns how many another process was scoring."""
        from tqdm import tqdm

        if self.backend is None and todo:
            with self.timings.phase("model engine and loads"):
                self.backend = make_backend(self.cfg, [c for c, _, _ in todo], self.model_args)
        if self.backend is not None:
            self.backend.plan([c for c, _, _ in todo])
        busy = 0
        bar = tqdm(todo, desc="checkpoints", unit="ckpt", disable=not todo or self.cfg.quiet)
        for c, place, cid in bar:
            bar.set_postfix_str(c.name)
            busy += not self.score(c, place, cid)
        if self.cfg.watch and self.views_stale:  # a round of --watch: the views show it before the pause
            self.rebuild_views()
        return busy

    def score(self, c: Checkpoint, place: dict, cid: str) -> bool:
        """One checkpoint's missing results into the store, under its claim, then the views; False
        when another process holds its claim (it scores it now)."""
        out = self.out
        error = check_weights(c) if c.kind != "base" else None
        lock = locks.claim_path(out, cid, self.claim_key)
        if error is None and not locks.try_lock(lock, self.cfg.lock_timeout):
            self.backend.finished(c)
            return False
        try:
            tasks = self.missing(cid) if error is None else []
            if tasks:
                results, seconds, error = self.evaluate(c, cid, tasks)
                if error is None:
                    with self.timings.phase("results into the store"):
                        self.store_results(place, cid, tasks, results, seconds)
        finally:
            locks.unlock(lock)
            if self.backend is not None:
                self.backend.finished(c)
        if error:
            self.fail(place, error)
        else:
            self.succeed(place, reused=not tasks)  # no task left: another process finished it meanwhile
        self.views_stale = True
        if time.monotonic() - self.views_at >= VIEWS_EVERY:
            self.rebuild_views()
        return True

    def rebuild_views(self) -> dict:
        """sweep.csv, sweep.json, the plot, the summary and the manifest from the store; returns the summary."""
        with self.timings.phase("views"):
            summary = rebuild_views(self.out, alpha=self.cfg.alpha, peak_step=self.cfg.peak_step,
                                    primary=self.cfg.primary)
        self.views_stale, self.views_at = False, time.monotonic()
        if self.reporter:  # each result of this run's settings, once per tracker run (trackers/reporter.py)
            with self.timings.phase("trackers"):
                self.reporter.log_rows(sweep_rows(self.out), set(self.hashes.values()))
        return summary

    def evaluate(self, c: Checkpoint, cid: str, tasks: list[str]) -> tuple[dict | None, float, str | None]:
        """lm-eval on one checkpoint's missing tasks: (results, seconds, None), or (results or None,
        seconds, the one-line error) when the checkpoint fails or was re-saved while it was scored
        (content id ``cid`` before); a missing package stops the whole sweep."""
        from ..evaluate import run_lm_eval

        cfg, backend, settings, phase = self.cfg, self.backend, self.settings, self.timings.phase
        try:
            with _hushed(cfg.quiet):
                with phase("model engine and loads"), quiet_upstream():  # peft's attach: a transformers notice
                    lm = backend.base_model(c.base) if c.kind == "base" else backend.model_for(c)
                start = time.perf_counter()
                probe = probe_for(t for name in tasks for t in settings[name]["num_fewshot"]) if cfg.knowledge else None
                with phase("evaluation"):
                    results = run_lm_eval(lm, tasks, limit=cfg.limit, task_manager=self.tm, log_samples=True,
                                          apply_chat_template=cfg.apply_chat_template, metadata=cfg.metadata,
                                          knowledge=probe, attention=cfg.attention, keep_probe_samples=True)
            seconds = time.perf_counter() - start
        except KeyboardInterrupt:
            raise
        except ImportError as err:  # the environment, not the checkpoint
            raise SweepError(f"a Python package is missing ({err}); {pip_line(err.name)}") from None
        except CheckpointError as err:  # says what is wrong with it and the fix
            return None, 0.0, str(err)
        except Exception as err:  # one bad checkpoint must not stop the sweep
            reason = " ".join(str(err).split())[:300] or type(err).__name__
            return None, 0.0, (f"{c.path}: evaluation failed ({type(err).__name__}: {reason}); check that the "
                               f"checkpoint loads with transformers{'/peft' if c.kind == 'lora' else ''}")
        with phase("checkpoint ids"):
            return results, seconds, _changed_while_scored(c, cid, self.out)

    def store_results(self, place: dict, cid: str, tasks: list[str], results: dict, seconds: float) -> None:
        """Each task's part of one lm-eval run, written once into the store."""
        for task in tasks:
            record = _result_record(cid, task, self.settings, self.hashes, seconds / len(tasks), place)
            part = _with_probe_samples(split_results(results, task), results, self.settings[task])
            self.scored.add(place["place"])
            try:
                store.write_result(self.out, cid, task, self.hashes[task], record, part)
            except OSError as err:
                if write_failure(err):
                    raise  # a full disk or a read-only folder: one line from the command, exit 1
                raise SweepError(f"--output_path {self.out}: cannot write results "
                                 f"({err.strerror or type(err).__name__}); fix it and run again") from None

    def wait_for_others(self, busy: int, waiting: int) -> int:
        """Checkpoints of this shard that another process is scoring: say so once, pause; returns
        the count last said."""
        if waiting != busy and not self.cfg.quiet:
            self.log(f"cf-tasks: waiting for {busy} checkpoint(s) that another process is scoring (claims in "
                     f"{self.out / locks.CLAIMS}; a claim whose owner is gone is taken over)", file=sys.stderr)
        with self.timings.phase("waiting for others"):
            time.sleep(min(self.cfg.poll_interval, 2.0))
        return busy

    def finish(self) -> int:
        """The views, the printed summary and the closing line; returns the number of this run's
        failed checkpoints."""
        summary = self.rebuild_views()
        if self.reporter:
            steps = [s.get("final_step") for s in summary.values() if s.get("final_step") is not None]
            self.reporter.log_summary(summary, max(steps, default=0))
            self.reporter.close()
        if not self.cfg.quiet:
            if summary:
                self.log(format_summary(summary))
        if self.cfg.timings:
            table = self.timings.table()
            self.log(self.timings.format(table))
            try:
                path = self.timings.write(self.out, table)
                self.log(f"cf-tasks: timings written to {path}", file=sys.stderr)
            except OSError as err:  # the results are stored: a table that cannot be kept fails nothing
                self.log(f"cf-tasks: timings not written to {self.out / 'timings'} "
                         f"({err.strerror or type(err).__name__}); the table above is all there is", file=sys.stderr)
        if not self.cfg.quiet:
            failed = set(self.failed)
            self.log(closing_line(self.cfg, self.out, self.settings, len(self.scored - failed),
                                  len(self.reused - self.scored - failed), len(failed)))
        return len(self.failed)


def run_sweep(cfg: SweepConfig, log=print) -> int:
    """Score every checkpoint into the store; returns the number of this run's failed checkpoints."""
    timings = Timings()
    run = SweepRun(cfg, log, timings)
    polls = waiting = 0
    while True:
        busy = run.score_all(run.plan_round())
        if busy and not cfg.watch:
            # Checkpoints of this shard that another process is scoring: wait for it (or for its
            # claim to go stale), so that exit 0 means this shard's results are all in the store.
            waiting = run.wait_for_others(busy, waiting)
            continue
        polls += 1
        if not cfg.watch or (cfg.max_polls is not None and polls >= cfg.max_polls):
            break
        with timings.phase("polling pause"):
            time.sleep(cfg.poll_interval)
    return run.finish()
