"""The sweep's store on a bad day: links into another run, damaged store files (named, set aside,
rescored), temp folders of other writers or of a killed report, empty and orphaned claims, views that
are copies (never links into the store), a full disk or a read-only folder at each write, two runs of
one name, a checkpoint re-saved while it is scored."""

import errno
import json
import os
import shutil
import socket
import time
from pathlib import Path
from unittest import mock

import pytest

from cf_tasks.cli import main
from cf_tasks.files import tmp_name
from cf_tasks.sweep import SweepConfig, locks, run_sweep, store, views
from tiny_model import build_full_checkpoint

TASK = "cf_capitals_mc"
QUIET = dict(log=lambda *a, **k: None)


@pytest.fixture(scope="module")
def swept(tiny_model, tmp_path_factory):
    """A run of two tiny checkpoints (and a third kept aside), swept once into ``out``."""
    root = tmp_path_factory.mktemp("badday")
    run = root / "runs" / "a" / "run"
    run.mkdir(parents=True)
    for step, seed in ((1, 1), (2, 2)):
        build_full_checkpoint(tiny_model, run / f"checkpoint-{step}", seed)
    spare = build_full_checkpoint(tiny_model, root / "spare", 3)
    out = root / "out"
    assert run_sweep(SweepConfig(run_dir=run, tasks=[TASK], output_path=out, limit=2), **QUIET) == 0
    return {"run": run, "out": out, "spare": spare}


def _copy(swept, tmp_path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(swept["out"], out)
    return out


def _args(run, out, *extra):
    """The command line of a sweep with the batch size of ``swept``'s run (SweepConfig's, 1): a
    log-likelihood can move in its 8th digit with the batch."""
    return ["sweep", str(run), "--tasks", TASK, "--output_path", str(out), "--limit", "2", "--backend", "hf",
            "--batch_size", "1", *extra]


def _rows(out):
    return json.loads((out / "sweep.json").read_text())["rows"]


def _values(out):
    """(run, checkpoint, step, metric) -> value from sweep.json; a duplicate row fails."""
    found = {}
    for r in _rows(out):
        key = (r["run"], r["checkpoint"], r["step"], r["metric"])
        assert key not in found, key
        found[key] = r["value"]
    return found


def _records(out):
    return sorted(p.parent for p in (out / "store").glob("*/*/*/record.json"))


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("cf-tasks: warning:")]


@pytest.fixture
def no_model(monkeypatch):
    import cf_tasks.sweep.plan as plan

    monkeypatch.setattr(plan, "make_backend", lambda *a: pytest.fail("a model was loaded"))


# ---------------------------------------------------------------- loss
def test_a_run_of_links_into_another_run_keeps_both_runs_rows(swept, tmp_path, no_model):
    out = _copy(swept, tmp_path)
    links = tmp_path / "links"
    links.mkdir()
    (links / "checkpoint-1").symlink_to(swept["run"] / "checkpoint-1")
    (links / "checkpoint-5").symlink_to(swept["run"] / "checkpoint-2")  # two links to one folder
    (links / "checkpoint-6").symlink_to(swept["run"] / "checkpoint-2")
    assert main(_args(links, out)) == 0  # every content is in the store already: nothing loads
    steps = {}
    for r in _rows(out):
        steps.setdefault(Path(r["run"]).name, set()).add(r["step"])
    assert steps == {"run": {1, 2}, "links": {1, 5, 6}}
    values = _values(out)
    real = str(swept["run"].resolve())
    assert values[(str(links.resolve()), "checkpoint-6", 6, "context_prob")] == values[
        (real, "checkpoint-2", 2, "context_prob")]
    assert len([f for f in (out / "checkpoints").iterdir() if (f / "results.json").is_file()]) == 5


@pytest.mark.parametrize("damage", ["record.json", "results.json", "where"])
def test_a_cut_short_store_file_is_named_set_aside_and_rescored_from_its_samples(swept, tmp_path, capsys, no_model,
                                                                                 damage):
    out = _copy(swept, tmp_path)
    before = _values(out)
    folder = _records(out)[0]
    path = next((folder.parent.parent / "where").glob("*.json")) if damage == "where" else folder / damage
    path.write_bytes(path.read_bytes()[:40])  # cut short
    assert main(["report", str(out)]) == 0  # the views skip it, and say so
    warnings = _warnings(capsys.readouterr().err)
    assert len(warnings) == 1 and str(path if damage == "where" else folder) in warnings[0], warnings
    assert "damaged" in warnings[0] and "moved to" in warnings[0]
    assert list((out / "damaged").rglob(path.name))  # set aside, not deleted
    assert len(_values(out)) == len(before) - len(before) // 2  # one checkpoint's rows are missing now
    assert main(_args(swept["run"], out)) == 0  # no model: rescored from the set-aside samples / place noted again
    err = capsys.readouterr().err
    if damage != "where":
        assert "rescored from the samples of its damaged result" in err
    assert _values(out) == before
    assert main(["report", str(out)]) == 0 and not _warnings(capsys.readouterr().err)


def test_cut_short_samples_are_set_aside_and_the_checkpoint_scored_again(swept, tmp_path, capsys):
    out = _copy(swept, tmp_path)
    before = _values(out)
    folder = _records(out)[0]
    samples = next(folder.glob("samples_*.jsonl"))
    damaged = samples.read_bytes()[:-30]
    samples.write_bytes(damaged)
    target = tmp_path / "merged"
    assert main(["report", str(out), "--output_path", str(target)]) == 0  # never copies the damaged file
    warnings = _warnings(capsys.readouterr().err)
    assert len(warnings) == 1 and samples.name in warnings[0] and "cut short" in warnings[0]
    assert not any(p.read_bytes() == damaged for p in (target / "store").rglob(samples.name))
    assert not folder.exists() and list((out / "damaged").rglob(samples.name))
    assert main(_args(swept["run"], out)) == 0  # scored again (the samples cannot be replayed)
    assert _values(out) == before


def test_a_malformed_where_file_and_wrong_types_in_sweep_json_are_one_line(swept, tmp_path, capsys):
    out = _copy(swept, tmp_path)
    where = next((out / "store").glob("*/where/*.json"))
    where.write_text(json.dumps({"place": 3, "id": None}))
    assert main(["report", str(out)]) == 0
    assert "not a place record" in _warnings(capsys.readouterr().err)[0]
    old = tmp_path / "old"  # an output of an earlier version: a sweep.json only
    old.mkdir()
    rows = _rows(out)
    rows[0]["step"] = "twelve"
    (old / "sweep.json").write_text(json.dumps({"rows": rows, "failures": []}))
    assert main(["report", str(old), "--output_path", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert 'row 1 has step "twelve", not a whole number' in err and "Traceback" not in err
    rows[0]["step"], rows[1]["value"] = 1, "0.5"
    (old / "sweep.json").write_text(json.dumps({"rows": rows, "failures": []}))
    assert main(["report", str(old), "--output_path", str(tmp_path / "t")]) == 2
    assert 'row 2 has value "0.5", not a number' in capsys.readouterr().err


# ---------------------------------------------------------------- temp folders
def test_views_never_read_a_writers_temp_folder_nor_a_killed_reports(swept, tmp_path, capsys):
    out = _copy(swept, tmp_path)
    before = _values(out)
    folder = _records(out)[0]
    live = folder.with_name(tmp_name(folder.name))  # another writer's, mid-rename (this process: alive)
    shutil.copytree(folder, live)
    (live / "results.json").unlink()  # what a reader racing the rename would find
    dead = folder.with_name(f".{folder.name}.{socket.gethostname().replace('.', '_')}.999999999.ab12cd34.cftmp")
    shutil.copytree(folder, dead)  # a report killed mid-copy (its process is gone)
    assert len(store.read_store(out)[0]) == 2
    assert main(["report", str(out)]) == 0
    assert _values(out) == before  # no duplicate rows, no traceback
    assert live.exists() and not dead.exists()  # the killed one's leftovers cleaned, the live writer's kept
    assert store.clean_leftovers(out, timeout=1e-9) == [] and live.exists()  # even with a tiny --lock_timeout


# ---------------------------------------------------------------- claims
def test_empty_orphaned_and_rebooted_claims_are_taken_over_promptly(tmp_path):
    lock = tmp_path / "claims" / "x.lock"
    lock.parent.mkdir()
    lock.write_bytes(b"")  # created, never written (a full disk)
    assert not locks.try_lock(lock, timeout=6 * 3600)  # its writer may still be writing it
    old = time.time() - locks.EMPTY_GRACE - 1
    os.utime(lock, (old, old))
    assert locks.try_lock(lock, timeout=6 * 3600)
    locks.unlock(lock)
    mine = {"pid": 1, "host": socket.gethostname(), "time": time.time()}
    lock.write_text(json.dumps({**mine, "boot": "a-boot-before-this-one"}))
    assert locks.try_lock(lock, timeout=6 * 3600)  # pid 1 runs, but that claim is from before a reboot
    locks.unlock(lock)
    stale = time.time() - locks.HEARTBEAT * locks.STALE_HEARTBEATS - 1
    lock.write_text(json.dumps({**mine, "host": "another-host", "heartbeat": locks.HEARTBEAT}))
    assert not locks.try_lock(lock, timeout=6 * 3600)  # another host's, renewed recently
    os.utime(lock, (stale, stale))
    assert locks.try_lock(lock, timeout=6 * 3600)  # its heartbeat stopped: its owner is gone
    assert json.loads(lock.read_text())["boot"] == locks.BOOT
    locks.unlock(lock)
    assert not lock.exists()


def test_a_full_disk_at_the_claim_leaves_no_empty_claim(swept, tmp_path, capsys):
    out = tmp_path / "out"
    full = OSError(errno.ENOSPC, "No space left on device")
    with mock.patch.object(locks, "_lock_info", autospec=True, side_effect=full):
        assert main(_args(swept["run"], out)) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"cf-tasks: error: {out / 'claims'}: cannot write there" in err
    assert "free space" in err and not list((out / "claims").glob("*.lock"))
    start = time.monotonic()
    assert main(_args(swept["run"], out)) == 0  # nothing left to wait for
    assert time.monotonic() - start < 120 and len(_records(out)) == 2


# ---------------------------------------------------------------- copies, not links
def test_views_and_reports_hand_out_copies_with_their_own_modes(swept, tmp_path):
    out = _copy(swept, tmp_path)
    for f in (out / "store").rglob("samples_*.jsonl"):
        f.chmod(0o444)  # read-only results
    shutil.rmtree(out / "checkpoints")
    views.rebuild_views(out)
    view = next((out / "checkpoints").rglob("samples_*.jsonl"))
    stored = next(p for p in (out / "store").rglob(view.name) if p.read_bytes() == view.read_bytes())
    assert view.stat().st_nlink == 1 and not os.path.samefile(view, stored)
    original = stored.read_bytes()
    view.write_text("edited\n")
    assert stored.read_bytes() == original
    target = tmp_path / "merged"
    assert main(["report", str(out), "--output_path", str(target)]) == 0
    for f in (target / "store").rglob("*.json*"):
        assert f.stat().st_mode & 0o200, f  # the report's copies are the user's files, writable


# ---------------------------------------------------------------- full disk, read-only
@pytest.mark.parametrize("where", ["result files", "record", "place", "views", "plot"])
def test_a_full_disk_at_each_write_is_one_line_and_keeps_finished_results(swept, tmp_path, capsys, where):
    import cf_tasks.results as results

    out = _copy(swept, tmp_path)
    run = tmp_path / "run"
    shutil.copytree(swept["run"], run)
    shutil.copytree(swept["spare"], run / "checkpoint-3")  # one new checkpoint to score
    kept = {p: (p / "record.json").read_bytes() for p in _records(out)}
    real_json, real_atomic = store.write_json, views.atomic_write

    def full(path):  # what the real writer raises when the disk is full: the error, with the file it wrote
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    def results_files(path, data):
        full(path)

    def record(path, value):
        return full(path) if path.name == "record.json" else real_json(path, value)

    def place(path, value):
        return full(path) if path.parent.name == "where" else real_json(path, value)

    def sweep_csv(path, data):
        return full(path) if path.name == "sweep.csv" else real_atomic(path, data)

    def png(path, data):
        return full(path) if path.suffix == ".png" else real_atomic(path, data)

    targets = {"result files": (results, "atomic_write", results_files), "record": (store, "write_json", record),
               "place": (store, "write_json", place), "views": (views, "atomic_write", sweep_csv),
               "plot": (views, "atomic_write", png)}
    module, name, fake = targets[where]
    with mock.patch.object(module, name, autospec=True, side_effect=fake):
        code = main(_args(run, out))
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err, err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith("cf-tasks: error:")]
    assert len(lines) == 1 and str(out) in lines[0] and "free space on that disk" in lines[0], lines
    assert ".cftmp" not in lines[0]  # the folder named is one the user knows, not a temp one
    assert all((p / "record.json").read_bytes() == data for p, data in kept.items())
    assert not list(out.rglob("*.cftmp")) and not list((out / "claims").glob("*.lock"))
    assert main(_args(run, out)) == 0 and len(_records(out)) == 3  # space back: it completes


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_a_read_only_report_output_or_store_is_one_line(swept, tmp_path, capsys, code):
    out = _copy(swept, tmp_path)
    def denied(path, data):
        raise OSError(code, os.strerror(code), str(path))

    with mock.patch.object(views, "atomic_write", autospec=True, side_effect=denied):
        assert main(["report", str(out), "--output_path", str(tmp_path / "merged")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"cf-tasks: error: {tmp_path / 'merged'}: cannot write there" in err
    assert "make that folder writable" in err
    real_mkdir = Path.mkdir
    run = tmp_path / "run"
    shutil.copytree(swept["run"], run)
    shutil.copytree(swept["spare"], run / "checkpoint-3")
    for folder in (store.STORE, "checkpoints"):  # a new folder in each cannot be made

        def mkdir(self, *a, **k):
            if self.parent.name == folder:
                raise OSError(code, os.strerror(code), str(self))
            return real_mkdir(self, *a, **k)

        with mock.patch.object(Path, "mkdir", autospec=True, side_effect=mkdir):
            assert main(_args(run, out)) == 1
        err = capsys.readouterr().err
        assert "Traceback" not in err and f"cf-tasks: error: {out / folder}: cannot write there" in err, err[-1500:]
        assert not list(out.rglob("*.cftmp")) and len(_records(out)) == 2 + (folder == "checkpoints")


def _unprivileged(root: Path):
    """How to run a Python command here without the power to ignore file permissions, as
    (command prefix, preexec_fn): as ``nobody`` where that user can read this checkout and its
    Python, else as root with every capability dropped (``setpriv``), so that a folder's mode binds.
    None where neither works. Each way is tried on a folder of mode 0555 first."""
    import pwd
    import subprocess
    import sys
    import tempfile

    if os.getuid() != 0:
        return None
    ways = []
    try:
        uid = pwd.getpwnam("nobody").pw_uid
        ways.append(([], lambda: os.setuid(uid)))
    except KeyError:
        pass
    if shutil.which("setpriv"):
        ways.append(([shutil.which("setpriv"), "--inh-caps=-all", "--bounding-set=-all", "--"], None))
    locked = Path(tempfile.mkdtemp(prefix="cf-tasks-probe-"))
    locked.chmod(0o555)
    check = ("import cf_tasks.cli, sys\ntry:\n    open(sys.argv[1] + '/x', 'w')\nexcept PermissionError:\n"
             "    sys.exit(0)\nsys.exit(3)\n")
    try:
        for prefix, preexec in ways:
            try:
                probe = subprocess.run([*prefix, sys.executable, "-c", check, str(locked)], cwd="/", capture_output=True,
                                       preexec_fn=preexec, env={**os.environ, "PYTHONPATH": str(root)}, timeout=120)
            except OSError:
                continue
            if probe.returncode == 0:  # it imports cf-tasks, and the folder's mode stopped its write
                return prefix, preexec
        return None
    finally:
        locked.chmod(0o755)
        shutil.rmtree(locked, ignore_errors=True)


def test_a_read_only_output_as_a_user_without_privileges(swept, tmp_path):
    """As root, permissions do not bind: the report runs in a subprocess as ``nobody``, or as root
    without capabilities."""
    import subprocess
    import sys
    import tempfile

    root = Path(__file__).resolve().parents[1]
    way = _unprivileged(root)
    if way is None:
        pytest.skip("no way to run without the power to ignore permissions (not root, or neither nobody nor setpriv works)")
    prefix, preexec = way
    base = Path(tempfile.mkdtemp(prefix="cf-tasks-ro-"))
    base.chmod(0o755)
    out = base / "out"
    shutil.copytree(swept["out"], out)
    for p in [out, *out.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)  # readable by all, writable by no one without privileges
    try:
        done = subprocess.run([*prefix, sys.executable, "-m", "cf_tasks.cli", "report", str(out)], cwd="/",
                              preexec_fn=preexec, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(root), "HOME": "/tmp", "MPLCONFIGDIR": "/tmp"})
        after = sorted((str(p.relative_to(out)), p.stat().st_size) for p in out.rglob("*"))
    finally:
        for p in [out, *out.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        shutil.rmtree(base)
    before = sorted((str(p.relative_to(swept["out"])), p.stat().st_size) for p in swept["out"].rglob("*"))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"cf-tasks: error: {out}" in done.stderr and "make that folder writable" in done.stderr
    assert after == before  # nothing written, nothing lost


# ---------------------------------------------------------------- two runs of one name
def test_two_runs_of_one_name_are_two_curves(swept, tmp_path, no_model):
    out = _copy(swept, tmp_path)
    other = tmp_path / "b" / "run"
    shutil.copytree(swept["run"], other)
    assert main(_args(other, out)) == 0  # same contents: reused from the store
    series = {r["series"] for r in _rows(out) if r["metric"] == "context_prob"}
    assert series == {f"{TASK} [a/run]", f"{TASK} [b/run]"}
    assert views.run_labels({"/x/a/run", "/x/b/run", "/y/c"}) == {"/x/a/run": "a/run", "/x/b/run": "b/run",
                                                                   "/y/c": "c"}


# ---------------------------------------------------------------- re-saved while scored
def test_a_checkpoint_resaved_while_scored_is_not_stored_under_its_old_id(swept, tmp_path, capsys, monkeypatch):
    import cf_tasks.evaluate as evaluate

    run = tmp_path / "run"
    run.mkdir()
    shutil.copytree(swept["spare"], run / "checkpoint-1")
    out = tmp_path / "out"
    old_id = store.checkpoint_identity(run / "checkpoint-1", "full", None)
    real = evaluate.run_lm_eval

    def resaved(*a, **k):  # the trainer writes new weights while the old ones are scored
        shutil.copyfile(swept["run"] / "checkpoint-1" / "model.safetensors", run / "checkpoint-1" / "model.safetensors")
        return real(*a, **k)

    monkeypatch.setattr(evaluate, "run_lm_eval", mock.create_autospec(real, side_effect=resaved))
    assert main(_args(run, out)) == 1
    err = capsys.readouterr().err
    assert "re-saved while it was scored" in err and old_id in err and "Traceback" not in err
    assert not (out / "store" / old_id / TASK).exists()
    monkeypatch.setattr(evaluate, "run_lm_eval", real)
    assert main(_args(run, out)) == 0
    new_id = store.checkpoint_identity(run / "checkpoint-1", "full", None)
    assert [p.parts[-3] for p in _records(out)] == [new_id]


@pytest.mark.slow
def test_three_writers_with_a_tiny_lock_timeout_leave_a_complete_store(swept, tmp_path):
    """Claims and temp folders time out almost at once: writers take over each other's claims and
    may score one checkpoint twice, but no view reads another writer's temp folder."""
    import subprocess
    import sys

    run = tmp_path / "run"
    shutil.copytree(swept["run"], run)
    shutil.copytree(swept["spare"], run / "checkpoint-3")
    out = tmp_path / "out"
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    procs = [subprocess.Popen([sys.executable, "-m", "cf_tasks.cli", *_args(run, out, "--lock_timeout", "0.001")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    codes = [p.wait(timeout=600) for p in procs]
    errs = [p.stderr.read() for p in procs]
    assert codes == [0, 0, 0] and not any("Traceback" in e for e in errs), [e[-1500:] for e in errs]
    values = _values(out)
    assert {k[2] for k in values} == {1, 2, 3}
    assert {k[1:]: v for k, v in values.items() if k[2] < 3} == {k[1:]: v for k, v in _values(swept["out"]).items()}
    assert len(_records(out)) == 3 and not list(out.rglob("*.cftmp"))


def test_a_sweep_says_it_waits_and_takes_over_an_empty_claim_at_once(swept, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copytree(swept["spare"], run / "checkpoint-3")
    out = tmp_path / "out"
    real = locks.try_lock
    calls = []

    def claim(path, timeout):
        calls.append(path)
        if path.name == "views.lock":
            return real(path, timeout)
        if len([p for p in calls if p == path]) == 1:
            return False  # first look: another process scores it
        if not path.exists():  # then that process's disk filled at its claim: an empty file is left
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"")
            old = time.time() - locks.EMPTY_GRACE - 1
            os.utime(path, (old, old))
        return real(path, timeout)

    start = time.monotonic()
    with mock.patch.object(locks, "try_lock", autospec=True, side_effect=claim):
        assert main(_args(run, out)) == 0  # with the default --lock_timeout of 6 hours
    assert time.monotonic() - start < 300
    err = capsys.readouterr().err
    assert err.count("cf-tasks: waiting for 1 checkpoint(s) that another process is scoring") == 1
    assert len(_records(out)) == 1 and not list((out / "claims").glob("*.lock"))
