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
checkpoint with a lock file created atomically (``O_CREAT | O_EXCL``) that names its owner: host
name, boot id (``/proc/sys/kernel/random/boot_id``) and pid. Ownership is proved as follows. On the
owner's host, the owner is alive while a process of that pid runs and the host has not rebooted since
(same boot id); otherwise the lock is taken over at once. The owner renews the lock's modification
time while it scores (a heartbeat every ``HEARTBEAT`` seconds), so a process on another host takes
over a lock whose time stamp is older than ``STALE_HEARTBEATS`` heartbeats (its owner's host died or
lost the shared file system), and a lock without a heartbeat (an older cf-tasks) once it is older
than the lock timeout. A lock file that is empty or unreadable (its writer died or the disk filled
between creating and writing it) is taken over once it is ``EMPTY_GRACE`` seconds old. ``sweep.csv``
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
import threading
import time
from pathlib import Path
from typing import Iterator

from ..errors import RunError
from ..checkpoints import DIGEST, NOT_MODEL_FILES, file_digest, folder_identity  # noqa: F401  (the content ids)
from ..files import HOST, atomic_write, tmp_name, tmp_owner
from ..results import RESULT_KEYS_BY_TASK, group_members

STORE = "store"
CLAIMS = "claims"
FAILURES = "failures"
DIGESTS = "digests"
DAMAGED = "damaged"
VIEWS_LOCK_TIMEOUT = 120.0
HEARTBEAT = 30.0  # seconds between renewals of a held claim's time stamp
STALE_HEARTBEATS = 10  # a claim with a heartbeat not renewed for this many periods is taken over
EMPTY_GRACE = 10.0  # seconds a claim file may stay empty (created, not yet written)


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
            alive = _alive(*owner)
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


# ---------------------------------------------------------------- locks
class Busy(RunError):
    """Another live process held the lock for longer than the wait (exit 1, one line: what to run
    once it has finished; every stored result stays)."""


def _boot_id() -> str:
    """This host's boot id (Linux): a pid seen under another boot id belongs to a process of a
    previous boot, gone since."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


BOOT = _boot_id()
_HELD: set[Path] = set()  # claims this process holds: their time stamps are renewed (the heartbeat)
_HELD_GUARD = threading.Lock()
_beating: list[threading.Thread] = []


_QUIET = threading.Event()  # never set: its wait() is the heartbeat's sleep, apart from time.sleep


def _beat() -> None:
    while True:
        _QUIET.wait(HEARTBEAT)
        with _HELD_GUARD:
            held = list(_HELD)
        for path in held:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                if _mine(json.loads(path.read_text())):
                    os.utime(path)


def _hold(path: Path) -> None:
    with _HELD_GUARD:
        _HELD.add(path)
        if not _beating or not _beating[0].is_alive():
            _beating[:] = [threading.Thread(target=_beat, name="cf-tasks claim heartbeat", daemon=True)]
            _beating[0].start()


def _lock_info() -> bytes:
    return json.dumps({"pid": os.getpid(), "host": HOST, "boot": BOOT, "time": time.time(),
                       "heartbeat": HEARTBEAT}).encode()


def _mine(info: dict) -> bool:
    return info.get("pid") == os.getpid() and info.get("host") == HOST and info.get("boot", BOOT) == BOOT


def _stale(path: Path, timeout: float) -> bool:
    """Whether the owner of lock file ``path`` is gone (see the module's docstring for how)."""
    try:
        age = time.time() - path.stat().st_mtime
        text = path.read_text()
    except FileNotFoundError:
        return True
    except OSError:
        return False  # unreadable for now: leave it to its owner
    try:
        info = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        info = None
    if not isinstance(info, dict) or not isinstance(info.get("pid"), int):
        return age > min(EMPTY_GRACE, timeout)  # empty or cut short: its writer died or the disk filled
    if _mine(info):
        return True  # this very process, interrupted before it could remove it
    if info.get("host") == HOST:
        if info.get("boot") and BOOT and info["boot"] != BOOT:
            return True  # made before this host rebooted
        return _alive(HOST, info["pid"]) is False or age > timeout
    beat = info.get("heartbeat")
    if isinstance(beat, (int, float)) and beat > 0:
        return age > min(beat * STALE_HEARTBEATS, timeout)
    return age > timeout


def try_lock(path: Path, timeout: float) -> bool:
    """Create lock file ``path`` atomically; a stale one (its owner is gone: see the module's
    docstring) is moved aside first. False: a live process holds it. A lock that cannot be written
    in full (a full disk) is removed again and the OSError raised."""
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
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(_lock_info())
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException as err:
            path.unlink(missing_ok=True)  # never leave an empty claim behind
            if isinstance(err, OSError) and err.filename is None:
                err.filename = str(path)
            raise
        _hold(path)
        return True
    return False


def unlock(path: Path) -> None:
    """Remove our own lock (one a taker replaced stays)."""
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        info = None
    with _HELD_GUARD:
        _HELD.discard(path)
    if isinstance(info, dict) and _mine(info):
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
            raise Busy(f"{path}: another process has been rebuilding the views for over {wait:.0f} s; every "
                       f"result is stored: run `cf-tasks report {Path(out)}` once it has finished")
        time.sleep(0.05)
    try:
        yield
    finally:
        unlock(path)


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
