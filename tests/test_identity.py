"""A checkpoint's store id is its full content: every byte of every weight file is hashed, and the
digest of an unchanged file is reused from the output folder's digest cache."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from cf_tasks import checkpoints
from cf_tasks.sweep import store

TENSORS = 33  # float32 tensors of 512 KiB: about 17 MB, well above any "small file" size


def _checkpoint(folder: Path) -> Path:
    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    save_file({f"layers.{i:02d}.weight": rng.standard_normal(128 << 10).astype(np.float32) for i in range(TENSORS)},
              str(folder / "model.safetensors"))
    (folder / "config.json").write_text('{"model_type": "llama"}\n')
    return folder


def _tensor_span(path: Path, name: str) -> tuple[int, int]:
    import json

    data = path.read_bytes()
    header_len = int.from_bytes(data[:8], "little")
    begin, end = json.loads(data[8:8 + header_len])[name]["data_offsets"]
    return 8 + header_len + begin, 8 + header_len + end


def test_two_checkpoints_that_differ_only_inside_one_middle_tensor_get_two_ids(tmp_path):
    """A partial fine-tune: every weight of one middle layer changes, the rest of the file is the
    same bytes (same size, same header, same first and last blocks)."""
    a = _checkpoint(tmp_path / "checkpoint-100")
    b = tmp_path / "checkpoint-200"
    b.mkdir()
    (b / "config.json").write_bytes((a / "config.json").read_bytes())
    data = bytearray((a / "model.safetensors").read_bytes())
    begin, end = _tensor_span(a / "model.safetensors", f"layers.{TENSORS // 2 - 1:02d}.weight")
    tuned = np.frombuffer(bytes(data[begin:end]), dtype=np.float32) * np.float32(1.01)
    data[begin:end] = tuned.tobytes()
    (b / "model.safetensors").write_bytes(bytes(data))
    assert (a / "model.safetensors").stat().st_size == (b / "model.safetensors").stat().st_size
    ids = {store.checkpoint_identity(c, "full", None) for c in (a, b)}
    assert len(ids) == 2


def test_a_copied_checkpoint_keeps_its_id_and_the_digest_is_the_whole_files(tmp_path):
    import xxhash

    a = _checkpoint(tmp_path / "checkpoint-1")
    copy = tmp_path / "elsewhere" / "checkpoint-1"
    copy.parent.mkdir()
    import shutil

    shutil.copytree(a, copy)
    assert store.checkpoint_identity(a, "full", None) == store.checkpoint_identity(copy, "full", None)
    f = a / "model.safetensors"
    whole = xxhash.xxh3_128(f.read_bytes()).digest()
    assert store.file_digest(f) == whole


def test_an_unchanged_file_is_not_hashed_again_and_a_rewritten_one_is(tmp_path):
    a = _checkpoint(tmp_path / "checkpoint-1")
    out = tmp_path / "out"
    first = store.checkpoint_identity(a, "full", None, cache=out)
    with mock.patch.object(checkpoints, "_full_digest", autospec=True, side_effect=checkpoints._full_digest) as hashed:
        assert store.checkpoint_identity(a, "full", None, cache=out) == first
        assert hashed.call_count == 0  # both files came from the cache
        f = a / "model.safetensors"
        data = bytearray(f.read_bytes())
        data[-1] ^= 0xFF
        f.write_bytes(bytes(data))  # same path, same size: only the time stamps moved
        assert store.checkpoint_identity(a, "full", None, cache=out) != first
        assert [Path(c.args[0]).name for c in hashed.call_args_list] == ["model.safetensors"]
    assert all(p.suffix == ".json" for p in (out / store.DIGESTS).iterdir())


def test_a_damaged_cache_entry_is_hashed_again_not_trusted(tmp_path):
    a = _checkpoint(tmp_path / "checkpoint-1")
    out = tmp_path / "out"
    first = store.checkpoint_identity(a, "full", None, cache=out)
    for entry in (out / store.DIGESTS).iterdir():
        entry.write_text("{not json")
    assert store.checkpoint_identity(a, "full", None, cache=out) == first


def test_a_file_that_cannot_be_read_raises_os_error(tmp_path):
    a = _checkpoint(tmp_path / "checkpoint-1")
    (a / "model.safetensors").chmod(0)
    if os.access(a / "model.safetensors", os.R_OK):
        pytest.skip("running as root: every file is readable")
    with pytest.raises(OSError):
        store.checkpoint_identity(a, "full", None, cache=tmp_path / "out")
