"""The sweep's results store: one finished result per (checkpoint content, task, evaluation settings).

Layout of a sweep output folder::

    store/<checkpoint id>/<task>/<settings>/   one result, written once: record.json, results.json,
                                               results.csv, samples_<task>.jsonl
    store/<checkpoint id>/where/<place>.json   each run folder and name this content was seen under
    digests/<path hash>.json                   a weight file's digest, valid while its size and time stamps hold
    claims/<checkpoint id>.<settings>.lock     a process scoring that checkpoint now (host, boot id, pid, time)
    failures/<place>.json                      the last failure of a checkpoint folder (retried next run)
    damaged/<time>/store/...                   store files found damaged (cut short, malformed), set aside

The checkpoint id comes from the checkpoint's content (file names, sizes and a 128-bit XXH3 digest of
every byte of every model file), so a re-saved checkpoint is a new id, a copied one the same, a fine-tune
that changed one layer a new one, and same-named checkpoints of two runs never collide. A file's
digest is cached under ``digests/`` keyed by its path, size, modification and change times and inode,
so a rerun does not read unchanged weights again; a cache entry is written atomically (a
concurrent writer writes the same bytes) and an unreadable one is recomputed. A result folder is built under a temporary name and renamed into place; a result that
exists is never replaced, and nothing of another key is touched. Any number of processes (shards,
Slurm array elements, a ``--watch`` beside a manual run) may share one output folder: each claims a
checkpoint before it scores it (the claims and how their owners are proved alive are in
``locks.py``); a temp file or folder of a writer that is gone is removed (``clean_leftovers``). ``sweep.csv``
and the other tables are views rebuilt from the store (see ``views.py``); they read only finished
result folders, never a temp one. Files are written by ``cf_tasks.files.atomic_write``; files and
folders get the umask's modes; what leaves the store (the views, ``report``) is a copy of its
contents, never a link into the store and never with the store's file modes.

A store file that is damaged (a cut-short or malformed ``record.json``, ``results.json``, samples file
or ``where/`` file) is named in one line and moved under ``damaged/`` (nothing is deleted); the
result it belonged to is then missing, so the next sweep makes it again: from the set-aside samples
where they survive (no model loaded), else by scoring the checkpoint again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

from ..checkpoints import DIGEST, NOT_MODEL_FILES, file_digest, folder_identity  # noqa: F401  (the content ids)
from ..files import atomic_write, tmp_name, tmp_owner
from ..results import RESULT_KEYS_BY_TASK, group_members
from .locks import owner_alive

STORE = "store"
FAILURES = "failures"
DIGESTS = "digests"
DAMAGED = "damaged"


# ---------------------------------------------------------------- identities
def checkpoint_identity(path: Path | None, kind: str, base: str | None, cache: Path | None = None) -> str:
    """The store id of a checkpoint: its content; a LoRA adapter's base model is part of it (the
    base's content too when it is a local folder). ``cache``: an output folder whose ``digests/``
    keeps the digests of files already read."""
    extra = f"base:{base}" if base else ""
    digests = Path(cache) / DIGESTS if cache is not None else None
    if kind == "base":
        folder = Path(base or "")
        return folder_identity(folder, extra, digests) if base and folder.is_dir() else \
            hashlib.sha256(extra.encode()).hexdigest()[:24]
    if base and Path(base).is_dir():
        extra += ":" + folder_identity(Path(base), cache=digests)
    return folder_identity(Path(path), extra, digests)


def settings_hash(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]


def place_hash(place: str) -> str:
    return hashlib.sha256(place.encode()).hexdigest()[:16]


def _safe(name: str) -> str:
    return name.replace("/", "_").replace(os.sep, "_")


# ---------------------------------------------------------------- files
def write_json(path: Path, value) -> None:
    atomic_write(path, (json.dumps(value, indent=2, sort_keys=True, default=str) + "\n").encode())


def clean_leftovers(out: Path, timeout: float) -> list[Path]:
    """Remove temp files and folders of killed runs: their process is gone from this host, or
    they are another host's and older than ``timeout``. A live writer's temp files are left alone."""
    removed = []
    now = time.time()
    for root, dirs, files in os.walk(out):
        for name in [*dirs, *files]:
            owner = tmp_owner(name)
            if owner is None:
                continue
            path = Path(root) / name
            try:
                old = now - path.lstat().st_mtime > timeout
            except FileNotFoundError:
                continue
            alive = owner_alive(*owner)
            if alive is False or (old and alive is None):  # a live writer of this host keeps its temps
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
                removed.append(path)
        dirs[:] = [d for d in dirs if tmp_owner(d) is None]
    return removed


# ---------------------------------------------------------------- results
def result_dir(out: Path, ckpt_id: str, task: str, settings: str) -> Path:
    return Path(out) / STORE / ckpt_id / _safe(task) / settings


def has_result(out: Path, ckpt_id: str, task: str, settings: str) -> bool:
    """Whether the store holds this result whole (a damaged one is set aside: it is missing then)."""
    folder = result_dir(out, ckpt_id, task, settings)
    if not (folder / "record.json").is_file():
        return False
    reason = result_damage(folder)
    if reason is None:
        return True
    set_aside(out, folder, reason)
    return (folder / "record.json").is_file()  # still there when it could not be moved


def write_result(out: Path, ckpt_id: str, task: str, settings: str, record: dict, results: dict) -> Path:
    """Write one result once: into a temp folder, then renamed into place. When another process
    finished the same key first, its result is kept and ours dropped (they are equal)."""
    from ..results import save_results

    final = result_dir(out, ckpt_id, task, settings)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(tmp_name(final.name))
    tmp.mkdir()
    try:
        save_results(results, tmp)
        write_json(tmp / "record.json", record)  # last: a folder with record.json is complete
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "record.json").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def note_place(out: Path, ckpt_id: str, place: dict) -> None:
    """Record that checkpoint content ``ckpt_id`` was seen at ``place`` (run folder, name, step)."""
    folder = Path(out) / STORE / ckpt_id / "where"
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / f"{place_hash(place['place'])}.json", {**place, "id": ckpt_id, "seen": time.time()})


REQUIRED_RECORD = {"id": str, "task": str, "settings": dict, "settings_hash": str}
REQUIRED_PLACE = {"place": str, "id": str, "name": str, "seen": (int, float), "step": (int, type(None))}
_CHECKED: dict[str, tuple] = {}  # result folders found whole, with their files' stamps when checked


def _has_fields(obj, required: dict) -> bool:
    """Whether ``obj`` is a dict whose fields have the ``required`` types."""
    return isinstance(obj, dict) and all(isinstance(obj.get(k), t) for k, t in required.items())


def _stamps(folder: Path) -> tuple:
    return tuple(sorted((f.name, st.st_size, st.st_mtime_ns, st.st_ino)
                        for f in folder.iterdir() if (st := f.stat()) and not tmp_owner(f.name)))


def _jsonl_damage(path: Path) -> str | None:
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        return "cut short (no line end at its end)"
    for number, line in enumerate(data.splitlines(), 1):
        if line.strip():
            try:
                if not isinstance(json.loads(line), dict):
                    return f"line {number} is not a JSON object"
            except (json.JSONDecodeError, UnicodeDecodeError):
                return f"line {number} is not valid JSON (cut short or malformed)"
    return None


def result_damage(folder: Path) -> str | None:
    """What is damaged in finished result folder ``folder`` (a file name and why), or None when its
    record, results and samples files all read (checked once per process while the files stay as they were)."""
    folder = Path(folder)
    try:
        stamps = _stamps(folder)
    except OSError:
        return None  # moved away meanwhile (set aside by another process)
    if _CHECKED.get(str(folder)) == stamps:
        return None
    try:
        record = json.loads((folder / "record.json").read_text())
        if not _has_fields(record, REQUIRED_RECORD):
            return "record.json: not a result record (malformed)"
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return "record.json: not valid JSON (cut short or malformed)"
    try:
        results = json.loads((folder / "results.json").read_text())
        if not isinstance(results, dict) or not isinstance(results.get("results"), dict):
            return "results.json: not an lm-eval results object (malformed)"
    except FileNotFoundError:
        return "results.json: missing"
    except (json.JSONDecodeError, UnicodeDecodeError):
        return "results.json: not valid JSON (cut short or malformed)"
    for path in sorted(folder.glob("samples_*.jsonl")):
        reason = _jsonl_damage(path)
        if reason:
            return f"{path.name}: {reason}"
    _CHECKED[str(folder)] = stamps
    return None


def set_aside(out: Path, path: Path, reason: str, what: str = "its result is made again by the next cf-tasks sweep "
              "of this output (from its samples where they survive)") -> Path | None:
    """Move damaged store file or result folder ``path`` under ``<out>/damaged/`` (nothing is deleted)
    and say so in one line; None when it could not be moved (then it is only named)."""
    out, path = Path(out), Path(path)
    try:
        rel = path.relative_to(out)
    except ValueError:
        rel = Path(path.name)
    dest = out / DAMAGED / time.strftime("%Y%m%dT%H%M%S") / rel
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        while dest.exists():
            dest = dest.with_name(dest.name + "_")
        os.rename(path, dest)
    except FileNotFoundError:
        return None  # another process set it aside first
    except OSError as err:
        print(f"cf-tasks: warning: {path}: damaged ({reason}); left in place ({err.strerror or type(err).__name__}); "
              "move it away by hand", file=sys.stderr)
        return None
    print(f"cf-tasks: warning: {path}: damaged ({reason}); moved to {dest}; {what}", file=sys.stderr)
    return dest


def _finished(ckpt: Path) -> list[Path]:
    """The finished result folders of a checkpoint id's folder: task/settings/ with a record.json,
    never a temp folder (a writer's, or a copy a killed process left) nor ``where/``."""
    found = []
    for task in sorted(ckpt.iterdir()) if ckpt.is_dir() else ():
        if task.name == "where" or tmp_owner(task.name) or not task.is_dir():
            continue
        for folder in sorted(task.iterdir()):
            if not tmp_owner(folder.name) and (folder / "record.json").is_file():
                found.append(folder)
    return found


def _read_record(out: Path, folder: Path) -> dict | None:
    """A finished result's record (with ``dir``), None when the folder is damaged (then set aside)."""
    reason = result_damage(folder)
    if reason is None:
        with contextlib.suppress(OSError, json.JSONDecodeError):
            return {**json.loads((folder / "record.json").read_text()), "dir": str(folder)}
        return None
    set_aside(out, folder, reason)
    return None


def _read_places(out: Path, ckpt: Path) -> list[dict]:
    places = []
    for path in sorted((ckpt / "where").glob("*.json")):
        if tmp_owner(path.name):
            continue
        try:
            place = json.loads(path.read_text())
            reason = None if _has_fields(place, REQUIRED_PLACE) else "not a place record (malformed)"
        except FileNotFoundError:
            continue
        except (json.JSONDecodeError, UnicodeDecodeError):
            reason = "not valid JSON (cut short or malformed)"
        except OSError:
            reason = "unreadable"
        if reason:
            set_aside(out, path, reason, "the next cf-tasks sweep of that run records it again")
            continue
        places.append(place)
    return places


def read_store(out: Path) -> tuple[list[dict], list[dict]]:
    """Every finished result's record (with ``dir``), and every place a checkpoint was seen. Temp
    folders are never read; damaged files are set aside (``set_aside``)."""
    records, places = [], []
    store = Path(out) / STORE
    if not store.is_dir():
        return records, places
    for ckpt in sorted(store.iterdir()):
        if not ckpt.is_dir() or tmp_owner(ckpt.name):
            continue
        places += _read_places(out, ckpt)
        for folder in _finished(ckpt):
            record = _read_record(out, folder)
            if record is not None:
                records.append(record)
    return records, places


def read_results(out: Path, ckpt_id: str) -> list[dict]:
    """The finished results' records (with ``dir``) of one checkpoint id (damaged ones set aside)."""
    found = []
    for folder in _finished(Path(out) / STORE / ckpt_id):
        record = _read_record(out, folder)
        if record is not None:
            found.append(record)
    return found


def damaged_sources(out: Path, ckpt_id: str, task: str, settings: str) -> list[Path]:
    """Set-aside result folders of this key whose samples files all read (newest first): what a
    damaged result can be rescored from."""
    found = []
    for folder in sorted((Path(out) / DAMAGED).glob(f"*/{STORE}/{ckpt_id}/{_safe(task)}/{settings}*"), reverse=True):
        samples = sorted(folder.glob("samples_*.jsonl"))
        with contextlib.suppress(OSError):
            if samples and not any(_jsonl_damage(p) for p in samples):
                found.append(folder)
    return found


def _copy_result(src: Path, dest: Path) -> None:
    """A result folder's files copied into new folder ``dest``: contents only (never a link into the
    store, never its modes: the copy gets the umask's modes)."""
    dest.mkdir()
    for f in sorted(src.iterdir()):
        if f.is_file() and not tmp_owner(f.name):
            shutil.copyfile(f, dest / f.name)


def merge_store(src: Path, target: Path) -> int:
    """Copy every finished result and place record of ``src``'s store that ``target``'s lacks (each
    result folder copied under a temporary name, then renamed into place; nothing of ``target`` is
    replaced), and ``src``'s failures of places with no result in either. Returns the results added."""
    src_store, dst_store = Path(src) / STORE, Path(target) / STORE
    if src_store.resolve() == dst_store.resolve() or not src_store.is_dir():
        return 0
    added = 0
    for ckpt in sorted(src_store.iterdir()):
        if not ckpt.is_dir() or tmp_owner(ckpt.name):
            continue
        for place in _read_places(src, ckpt):
            dest = dst_store / ckpt.name / "where" / f"{place_hash(place['place'])}.json"
            if not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                write_json(dest, place)
        for folder in _finished(ckpt):
            dest = dst_store / ckpt.name / folder.parent.name / folder.name
            if (dest / "record.json").is_file() or _read_record(src, folder) is None:
                continue  # there already, or damaged (set aside, never copied)
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(tmp_name(dest.name))
            try:
                _copy_result(folder, tmp)
                os.rename(tmp, dest)
                added += 1
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
                if not (dest / "record.json").is_file():
                    raise
    records, places = read_store(target)
    scored = {record["id"] for record in records}
    with_results = {place["place"] for place in places if place["id"] in scored}
    for failure in read_failures(src):
        dest = failure_path(target, failure["place"])
        if failure["place"] not in with_results and not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(dest, (json.dumps(failure, indent=2, sort_keys=True) + "\n").encode())
    return added


# ---------------------------------------------------------------- failures
def failure_path(out: Path, place: str) -> Path:
    return Path(out) / FAILURES / f"{place_hash(place)}.json"


def record_failure(out: Path, place: dict, error: str) -> None:
    (Path(out) / FAILURES).mkdir(parents=True, exist_ok=True)
    write_json(failure_path(out, place["place"]), {**place, "error": error, "time": time.time()})


def clear_failure(out: Path, place: str) -> None:
    failure_path(out, place).unlink(missing_ok=True)


def read_failures(out: Path) -> list[dict]:
    found = []
    for path in sorted((Path(out) / FAILURES).glob("*.json")):
        with contextlib.suppress(OSError, json.JSONDecodeError):
            found.append(json.loads(path.read_text()))
    return found


# ---------------------------------------------------------------- one result per requested task


def split_results(results: dict, name: str) -> dict:
    """The part of an lm-eval results dict that belongs to requested task (or group) ``name``."""
    keep = group_members(results, name)
    part = {k: v for k, v in results.items() if k not in RESULT_KEYS_BY_TASK}
    for key in RESULT_KEYS_BY_TASK:
        if key in results:
            part[key] = {t: v for t, v in results[key].items() if t in keep}
    return part


def merge_results(parts: list[dict]) -> dict:
    merged: dict = {}
    for part in parts:
        for key, value in part.items():
            if key in RESULT_KEYS_BY_TASK:
                merged.setdefault(key, {}).update(value)
            else:
                merged.setdefault(key, value)
    return merged
