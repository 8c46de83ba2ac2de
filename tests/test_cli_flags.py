"""One flag style (lm-eval's underscores; earlier hyphen spellings still accepted, not shown), the
defaults in every --help, every flag in the README or a guide, and report never writing into an input unasked."""

import re

import pytest

from cf_tasks.cli import HIDDEN_ALIASES, build_parser, main
from conftest import ROOT


def _subcommands():
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.choices and isinstance(a.choices, dict)]
    return sub.choices


def _flags():
    return sorted({(name, option) for name, p in _subcommands().items() for a in p._actions
                   for option in a.option_strings if option not in ("-h", "--help")})


@pytest.mark.parametrize("command,flag", _flags())
def test_every_flag_is_underscored_or_a_hidden_alias_and_in_the_docs(command, flag):
    if flag in HIDDEN_ALIASES:
        assert flag.replace("-", "_").replace("__", "--", 1) != flag  # the visible spelling exists
        return
    assert "-" not in flag[2:], f"cf-tasks {command} {flag}: use underscores, as lm-eval does"
    docs = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    assert re.search(re.escape(flag) + r"(?![\w-])", docs), f"cf-tasks {command} {flag} is in neither the README nor a guide"


def test_help_shows_defaults_and_hides_the_hyphen_aliases():
    commands = _subcommands()
    sweep = commands["sweep"].format_help()
    assert re.search(r"--lora_group LORA_GROUP\s+.*?\(default: 4\)", sweep, re.S)
    assert "(default: 30.0)" in sweep and "(default: None)" not in sweep and "(default: False)" not in sweep
    publish = commands["publish"].format_help()
    assert "--repo_id" in publish and "--dry_run" in publish
    assert "--repo-id" not in publish and "--dry-run" not in publish
    assert "--no-apply_chat_template" not in commands["eval"].format_help()


def test_the_hyphen_spellings_still_work():
    parser = build_parser()
    args = parser.parse_args(["publish", "--repo-id", "org/name", "--dry-run", "--out", "x"])
    assert (args.repo_id, args.dry_run) == ("org/name", True)
    assert parser.parse_args(["eval", "--no-apply_chat_template"]).apply_chat_template is False
    assert parser.parse_args(["eval", "--no_apply_chat_template"]).apply_chat_template is False
    assert parser.parse_args(["eval", "--apply_chat_template"]).apply_chat_template is True
    assert parser.parse_args(["eval"]).apply_chat_template is None


def test_report_of_two_folders_needs_an_output_path(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    assert main(["report", str(a), str(b)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--output_path" in err and str(a) in err
    assert not any(a.iterdir()) and not any(b.iterdir())
