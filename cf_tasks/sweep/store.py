"""The sweep's results store: one finished result per (checkpoint content, task, evaluation settings).

Layout of a sweep output folder::

    store/<checkpoint id>/<task>/<settings>/   one result, written once: record.json, results.json,
                                               results.csv, samples_<task>.jsonl
    store/<checkpoint id>/where/<place>.json   each run folder and name this content was seen under
    claims/<checkpoint id>.<settings>.lock     a process scoring that checkpoint now (pid, host, time)
    failures/<place>.json                      the last failure of a checkpoint folder (retried next run)

The checkpoint id comes from the checkpoint's content (file names, sizes and a sampled digest), so a
re-saved checkpoint is a new id, a copied one the same, and same-named checkpoints of two runs never
collide. A result folder is built under a temporary name and renamed into place; a result that
exists is never replaced, and nothing of another key is touched. Any number of processes (shards,
Slurm array elements, a ``--watch`` beside a manual run) may share one output folder: each claims a
checkpoint with a lock file created atomically (``O_CREAT | O_EXCL``); a lock whose process died on
this host, or that is older than the lock timeout, is taken over. ``sweep.csv`` and the other
tables are views rebuilt from the store (see ``views.py``). Files are written by
``cf_tasks.files.atomic_write``; files and folders get the umask's modes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Iterator

from ..files import HOST, atomic_write, tmp_name, tmp_owner

STORE = "store"
CLAIMS = "claims"
FAILURES = "failures"
SMALL_FILE = 4 << 20  # files up to this size are hashed whole
BLOCK = 64 << 10
SAMPLED_BLOCKS = 16
MAX_HEADER = 64 << 20
NOT_MODEL_FILES = ("optimizer", "scheduler", "rng_state", "scaler", "trainer_state", "training_args")
VIEWS_LOCK_TIMEOUT = 120.0


# ---------------------------------------------------------------- identities
def _file_digest(path: Path, size: int) -> bytes:
    """The whole content of a small file; for a large one its head (a safetensors file's whole
    header), ``SAMPLED_BLOCKS`` blocks spread over it and its tail: cheap on multi-GB weights, and
    re-randomised or re-trained weights change every sampled block."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        if size <= SMALL_FILE:
            h.update(fh.read())
            return h.digest()
        head = BLOCK
        if path.suffix == ".safetensors":
            header_len = int.from_bytes(fh.read(8), "little")
            head = 8 + min(header_len, MAX_HEADER)
            fh.seek(0)
        h.update(fh.read(head))
        for i in range(SAMPLED_BLOCKS + 1):
            fh.seek(max(0, (size - BLOCK) * i // SAMPLED_BLOCKS))
            h.update(fh.read(BLOCK))
    return h.digest()


def folder_identity(folder: Path, extra: str = "") -> str:
    """A content id of a model folder: its model files' relative names, sizes and digests
    (optimizer and trainer state, hidden and temp files left out)."""
    h = hashlib.sha256(extra.encode())
    for f in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        rel = f.relative_to(folder).as_posix()
        if any(part.startswith(".") for part in rel.split("/")) or f.name.startswith(NOT_MODEL_FILES):
            continue
        size = f.stat().st_size
        h.update(f"{rel}\0{size}\0".encode())
        h.update(_file_digest(f, size))
    return h.hexdigest()[:24]


def checkpoint_identity(path: Path | None, kind: str, base: str | None) -> str:
    """The store id of a checkpoint: its content; a LoRA adapter's base model is part of it (the
    base's content too when it is a local folder)."""
    extra = f"base:{base}" if base else ""
    if kind == "base":
        folder = Path(base or "")
        return folder_identity(folder, extra) if base and folder.is_dir() else hashlib.sha256(extra.encode()).hexdigest()[:24]
    if base and Path(base).is_dir():
        extra += ":" + folder_identity(Path(base))
    return folder_identity(Path(path), extra)


def settings_hash(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]


def place_hash(place: str) -> str:
    return hashlib.sha256(place.encode()).hexdigest()[:16]


def _safe(name: str) -> str:
    return name.replace("/", "_").replace(os.sep, "_")


# ---------------------------------------------------------------- files
def write_json(path: Path, value) -> None:
    atomic_write(path, (json.dumps(value, indent=2, sort_keys=True, default=str) + "\n").encode())


def _alive(host: str, pid: int) -> bool | None:
    """Whether process ``pid`` runs; None when it is on another host (unknown from here)."""
    if host != HOST:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_leftovers(out: Path, timeout: float) -> list[Path]:
    """Remove temp files and folders of killed runs: their process is gone from this host, or
    they are older than ``timeout``. A live writer's temp files are left alone."""
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
            if _alive(*owner) is False or old:
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
    return (result_dir(out, ckpt_id, task, settings) / "record.json").is_file()


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


def read_store(out: Path) -> tuple[list[dict], list[dict]]:
    """Every finished result's record (with ``dir``), and every place a checkpoint was seen."""
    records, places = [], []
    store = Path(out) / STORE
    if not store.is_dir():
        return records, places
    for ckpt in sorted(store.iterdir()):
        if not ckpt.is_dir() or tmp_owner(ckpt.name):
            continue
        for path in sorted((ckpt / "where").glob("*.json")):
            with contextlib.suppress(OSError, json.JSONDecodeError):
                places.append(json.loads(path.read_text()))
        for path in sorted(ckpt.glob("*/*/record.json")):
            if path.parent.parent.name == "where":
                continue
            try:
                records.append({**json.loads(path.read_text()), "dir": str(path.parent)})
            except (OSError, json.JSONDecodeError):
                continue  # a record is written last and atomically: unreadable only if damaged by hand
    return records, places


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
        for path in sorted((ckpt / "where").glob("*.json")):
            dest = dst_store / ckpt.name / "where" / path.name
            if not dest.exists() and not tmp_owner(path.name):
                dest.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(dest, path.read_bytes())
        for record in sorted(ckpt.glob("*/*/record.json")):
            folder = record.parent
            if folder.parent.name == "where" or tmp_owner(folder.name):
                continue
            dest = dst_store / ckpt.name / folder.parent.name / folder.name
            if (dest / "record.json").is_file():
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(tmp_name(dest.name))
            try:
                shutil.copytree(folder, tmp)
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


# ---------------------------------------------------------------- locks
class Busy(Exception):
    """Another live process holds the lock."""


def _lock_info() -> bytes:
    return json.dumps({"pid": os.getpid(), "host": HOST, "time": time.time()}).encode()


def _stale(path: Path, timeout: float) -> bool:
    try:
        age = time.time() - path.stat().st_mtime
        text = path.read_text()
    except FileNotFoundError:
        return True
    try:
        info = json.loads(text)
    except json.JSONDecodeError:  # a taker is writing it right now, or it was cut short
        info = {}
    if info.get("pid") == os.getpid() and info.get("host") == HOST:
        return True  # this very process, interrupted before it could remove it
    alive = _alive(str(info.get("host", "")), int(info.get("pid", -1))) if info.get("pid") else None
    return alive is False or age > timeout


def try_lock(path: Path, timeout: float) -> bool:
    """Create lock file ``path`` atomically; a stale one (its process is gone from this host, or it
    is older than ``timeout``) is moved aside first. False: a live process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            if not _stale(path, timeout):
                return False
            aside = path.with_name(tmp_name(path.name))
            try:
                seen = path.read_bytes()
                os.rename(path, aside)  # one taker wins the rename
            except FileNotFoundError:
                continue
            if aside.read_bytes() != seen:  # a fresh lock got in between: put it back
                with contextlib.suppress(OSError):
                    os.link(aside, path)
                aside.unlink(missing_ok=True)
                return False
            aside.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "wb") as fh:
            fh.write(_lock_info())
        return True
    return False


def unlock(path: Path) -> None:
    """Remove our own lock (one a taker replaced stays)."""
    try:
        info = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return
    if info.get("pid") == os.getpid() and info.get("host") == HOST:
        path.unlink(missing_ok=True)


def claim_path(out: Path, ckpt_id: str, settings: str) -> Path:
    return Path(out) / CLAIMS / f"{ckpt_id}.{settings}.lock"


@contextlib.contextmanager
def views_lock(out: Path, wait: float = VIEWS_LOCK_TIMEOUT) -> Iterator[None]:
    """A short lock while the views are rebuilt, so that an older rebuild never lands last."""
    path = Path(out) / CLAIMS / "views.lock"
    deadline = time.monotonic() + wait
    while not try_lock(path, timeout=wait):
        if time.monotonic() > deadline:
            raise Busy(f"{path}: held for over {wait:.0f} s")
        time.sleep(0.05)
    try:
        yield
    finally:
        unlock(path)


# ---------------------------------------------------------------- one result per requested task
RESULT_KEYS_BY_TASK = ("results", "groups", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better",
                       "n-samples", "samples", "attention")


def _members(results: dict, name: str) -> set[str]:
    found, todo = set(), [name]
    subtasks = results.get("group_subtasks", {})
    while todo:
        t = todo.pop()
        if t not in found:
            found.add(t)
            todo += subtasks.get(t, [])
    return found


def split_results(results: dict, name: str) -> dict:
    """The part of an lm-eval results dict that belongs to requested task (or group) ``name``."""
    keep = _members(results, name)
    part = {k: v for k, v in results.items() if k not in RESULT_KEYS_BY_TASK}
    for key in RESULT_KEYS_BY_TASK:
        if key in results:
            part[key] = {t: v for t, v in results[key].items() if t in keep}
    return part


def _merge_results(parts: list[dict]) -> dict:
    merged: dict = {}
    for part in parts:
        for key, value in part.items():
            if key in RESULT_KEYS_BY_TASK:
                merged.setdefault(key, {}).update(value)
            else:
                merged.setdefault(key, value)
    return merged
