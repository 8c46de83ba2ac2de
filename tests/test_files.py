"""cf_tasks.files.atomic_write, the one temp-then-rename writer: modes, concurrency, fsync, failures."""

import os
import threading
from unittest import mock

import pytest

from cf_tasks import files
from cf_tasks.files import TMP_MARK, atomic_write, tmp_name, tmp_owner


def _leftovers(folder):
    return [p for p in folder.iterdir() if p.name.endswith(TMP_MARK)]


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_the_file_gets_the_umask_mode(tmp_path, umask):
    old = os.umask(umask)
    try:
        atomic_write(tmp_path / "a.json", b"{}")
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o666 & ~umask


def test_concurrent_writers_of_one_file_never_collide(tmp_path):
    target = tmp_path / "results.json"
    payloads = [bytes([65 + i]) * (256 << 10) for i in range(8)]  # 256 KiB each: writes overlap
    errors = []

    def writer(data):
        try:
            for _ in range(10):
                atomic_write(target, data)
        except Exception as err:  # surfaced below: a thread's exception is otherwise lost
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert target.read_bytes() in payloads  # one writer's whole file, never a mix
    assert _leftovers(tmp_path) == []


def test_temp_names_are_unique_and_carry_their_owner(monkeypatch):
    names = {tmp_name("x.json") for _ in range(1000)}
    assert len(names) == 1000
    assert tmp_owner(next(iter(names))) == (files.HOST, os.getpid())
    monkeypatch.setattr(files, "HOST", "node1.cluster.local")  # dots in a host name stay readable
    assert tmp_owner(tmp_name("results.v2.json")) == ("node1.cluster.local", os.getpid())
    assert tmp_owner(".results.v2.json.node2_cluster_local.77.0a1b" + TMP_MARK)[0] != "node1.cluster.local"
    assert tmp_owner("results.json") is None and tmp_owner("x" + TMP_MARK) is None


def test_the_bytes_reach_the_disk_before_the_rename(tmp_path, monkeypatch):
    events = []
    fsync = mock.create_autospec(os.fsync, side_effect=lambda fd: events.append(("fsync", os.fstat(fd).st_size)))
    replace = mock.create_autospec(os.replace, side_effect=lambda a, b: events.append(("replace", a, b)))
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    atomic_write(tmp_path / "a.bin", b"12345")
    assert [e[0] for e in events] == ["fsync", "replace"]
    assert events[0][1] == 5  # the whole file was written when it was synced
    assert tmp_owner(os.path.basename(events[1][1])) == (files.HOST, os.getpid())


@pytest.mark.parametrize("failure", ["rename", "write"])
def test_a_failed_write_removes_its_temp_and_keeps_the_old_file(tmp_path, monkeypatch, failure):
    target = tmp_path / "a.json"
    target.write_bytes(b"old")
    if failure == "rename":
        monkeypatch.setattr(os, "replace", mock.create_autospec(os.replace, side_effect=OSError(28, "No space left")))
        data = b"new"
    else:
        data = "not bytes"  # the write itself raises
    with pytest.raises((OSError, TypeError)):
        atomic_write(target, data)
    assert target.read_bytes() == b"old"
    assert _leftovers(tmp_path) == []


def test_atomic_open_streams_into_place_or_leaves_the_old_file(tmp_path):
    target = tmp_path / "out.jsonl"
    target.write_bytes(b"old\n")
    with pytest.raises(RuntimeError):
        with files.atomic_open(target) as fh:
            fh.write(b"half")
            assert target.read_bytes() == b"old\n"  # nothing under the real name while writing
            raise RuntimeError
    assert target.read_bytes() == b"old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]
    with files.atomic_open(target) as fh:
        fh.write(b"a\n")
        fh.write(b"b\n")
    assert target.read_bytes() == b"a\nb\n" and sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]
