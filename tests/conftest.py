import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# Nothing in the test suite may wait on the Hugging Face Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The tests' validated dataset builds are cached in a folder of their own, never the user's cache
# (a test run neither reads a user's builds nor leaves its own behind); subprocesses inherit it.
_TEST_CACHE = tempfile.mkdtemp(prefix="cf-tasks-test-datasets-")
os.environ["CF_TASKS_DATASET_CACHE"] = _TEST_CACHE
atexit.register(shutil.rmtree, _TEST_CACHE, True)
sys.path.insert(0, str(Path(__file__).parent))

ROOT = Path(__file__).resolve().parents[1]

# The team's builder seeds: every dataset validates on each. The first three run in every test run,
# the others under the slow marker (pytest -m "not slow" is the quick tier).
TEAM_SEEDS = (0, 1, 1234, 15614, 41876, 65866, 67086, 84830, 13453, 29267, 78779, 81460, 72950)
QUICK_SEEDS = TEAM_SEEDS[:3]


def seed_matrix() -> list:
    """``TEAM_SEEDS`` for ``pytest.mark.parametrize``: the quick seeds plain, the others marked slow."""
    return [s if s in QUICK_SEEDS else pytest.param(s, marks=pytest.mark.slow) for s in TEAM_SEEDS]


@pytest.fixture(scope="session")
def load_benchmark():
    """A script of ``benchmarks/`` imported as a module, by name (``load_benchmark("inversion_sim")``)."""
    import importlib.util

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny random Llama whose word-level vocabulary covers the datasets' text."""
    from tiny_model import build_tiny_model, dataset_corpus

    return build_tiny_model(tmp_path_factory.mktemp("tiny_llama"), dataset_corpus())


@pytest.fixture
def made_backends(monkeypatch):
    """The backends ``run_sweep`` makes, kept for the test to inspect."""
    import cf_tasks.sweep.plan as sweep

    made = []
    real = sweep.make_backend
    monkeypatch.setattr(sweep, "make_backend", lambda *a: made.append(real(*a)) or made[-1])
    return made
