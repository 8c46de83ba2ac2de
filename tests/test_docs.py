"""The README and the guides stay true: every `cf-tasks ...` and `lm_eval ...` command they show
parses (and its --help prints), the lm-eval tasks they name exist, and every relative link (file and
#anchor) leads somewhere."""

import re
import shlex
import sys
from pathlib import Path

import pytest

from cf_tasks.cli import build_parser
from conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED = DOCS + sorted((ROOT / "task_yamls").glob("*/README.md")) + sorted((ROOT / "examples").glob("*/README.md"))
PROGRAMS = ("cf-tasks", "lm_eval")


def _code_blocks(text: str) -> list[str]:
    """The shell blocks (```bash, ```sh or a bare fence); every fenced block is matched, so that the
    closing fence of a ```python block never opens a block of prose."""
    return [body for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, re.S) if lang in ("", "bash", "sh")]


def _commands(path: Path) -> list[tuple[str, list[str]]]:
    """(program, arguments) of each command in the file's code blocks; `&&` chains are split,
    `VAR=value` prefixes and `# comments` dropped, `\\` continuations joined."""
    found = []
    for block in _code_blocks(path.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            if line.lstrip().startswith("#"):
                continue
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                    words = words[1:]
                if words and Path(words[0]).name in PROGRAMS:
                    found.append((Path(words[0]).name, words[1:]))
    return found


ALL_COMMANDS = [(path, program, args) for path in DOCS for program, args in _commands(path)]


def _ids(commands):
    return [f"{path.relative_to(ROOT)}: {program} {' '.join(args)}"[:120] for path, program, args in commands]


def test_the_docs_show_commands_of_both_programs():
    programs = {program for _, program, _ in ALL_COMMANDS}
    assert programs == set(PROGRAMS)
    shown = {args[0] for _, program, args in ALL_COMMANDS if program == "cf-tasks"}
    assert {"eval", "sweep", "report", "build", "publish", "filter-data", "experiment"} <= shown


CF_COMMANDS = [c for c in ALL_COMMANDS if c[1] == "cf-tasks"]


@pytest.mark.parametrize("path,program,args", CF_COMMANDS, ids=_ids(CF_COMMANDS))
def test_cf_tasks_command_parses_and_helps(path, program, args, capsys):
    try:
        parsed = build_parser().parse_args(args)
    except SystemExit as exc:
        pytest.fail(f"{path.name}: cf-tasks {' '.join(args)} does not parse (exit {exc.code}): {capsys.readouterr().err}")
    assert callable(parsed.func)
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([*args, "--help"])
    assert exc.value.code == 0 and "usage: cf-tasks " + args[0] in capsys.readouterr().out


LM_EVAL_COMMANDS = [c for c in ALL_COMMANDS if c[1] == "lm_eval"]


@pytest.fixture(scope="module")
def task_index():
    """Our tasks (an instant index) and, only when a doc names another, lm-eval's own (~7 s)."""
    from cf_tasks.registry import task_manager

    names = set(task_manager().all_tasks)
    wanted = {t for _, _, args in LM_EVAL_COMMANDS + CF_COMMANDS for t in _tasks_of(args)}
    if wanted - names:
        names |= set(task_manager(include_defaults=True).all_tasks)
    return names


def _tasks_of(args: list[str]) -> list[str]:
    for flag, value in zip(args, args[1:]):
        if flag == "--tasks":
            return value.split(",")
    return []


@pytest.mark.parametrize("path,program,args", LM_EVAL_COMMANDS, ids=_ids(LM_EVAL_COMMANDS))
def test_lm_eval_command_parses_and_names_tasks_that_exist(path, program, args, task_index, monkeypatch, capsys):
    from lm_eval._cli import HarnessCLI

    monkeypatch.setattr(sys, "argv", ["lm_eval", *args])
    try:
        parsed = HarnessCLI().parse_args()
    except SystemExit as exc:
        pytest.fail(f"{path.name}: lm_eval {' '.join(args)} does not parse (exit {exc.code}): {capsys.readouterr().err}")
    assert parsed.command == "run"
    missing = [t for t in _tasks_of(args) if t not in task_index]
    assert _tasks_of(args) and not missing, f"{path.name}: lm_eval names tasks that do not exist: {missing}"


def test_every_task_named_by_a_cf_tasks_command_exists(task_index):
    missing = {(path.name, t) for path, _, args in CF_COMMANDS for t in _tasks_of(args) if t not in task_index}
    assert not missing


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def _links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]


LINKS = [(path, target) for path in LINKED for target in _links(path)]


@pytest.mark.parametrize("path,target", LINKS, ids=[f"{p.relative_to(ROOT)}->{t}" for p, t in LINKS])
def test_relative_link_is_alive(path, target):
    file, _, anchor = target.partition("#")
    dest = (path.parent / file).resolve() if file else path
    assert dest.exists(), f"{path.relative_to(ROOT)}: link to {target}: no such file"
    if anchor and dest.suffix == ".md":
        assert anchor in _anchors(dest), f"{path.relative_to(ROOT)}: link to {target}: no such heading"


def test_slug_matches_github():
    assert _slug("Registration: how `lm_eval --tasks cf_bio` finds the tasks") == (
        "registration-how-lm_eval---tasks-cf_bio-finds-the-tasks")
    assert _slug("Attention on the context: `--attention`") == "attention-on-the-context---attention"


def test_readme_is_a_front_page_that_links_every_guide():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in _links(ROOT / "README.md")}
    guides = set(DOCS[1:])
    assert not guides - linked, f"guides the README does not link: {sorted(p.name for p in guides - linked)}"
