"""What a sweep prints: one closing line saying what it did (scored, reused with the settings it
matched, failed), --quiet keeping only failures, and none of lm-eval's developer notices."""

import shutil

from cf_tasks.cli import main
from cf_tasks.sweep.stats import format_summary
from test_sweep import run_dir  # noqa: F401  (the tiny run folder, built once per module)


def _sweep(run, out, *extra):
    return main(["sweep", str(run), "--tasks", "cf_capitals_mc", "--limit", "2", "--output_path", str(out),
                 "--backend", "hf", *extra])


def test_a_sweep_and_its_rerun_say_what_they_did(run_dir, tmp_path, capfd, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)  # not a git checkout: lm-eval's git call would print "fatal: ..."
    out = tmp_path / "out"
    assert _sweep(run_dir["lora"], out) == 0
    first = capfd.readouterr()
    assert first.out.strip().splitlines()[-1] == "sweep: 2 checkpoints: 2 scored, 0 reused, 0 failed"
    for noise in ("Custom kwargs can be passed", "fatal: not a git repository", "is_gradient_checkpointing"):
        assert noise not in first.out + first.err

    assert _sweep(run_dir["lora"], out) == 0
    last = capfd.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"sweep: 2 checkpoints: 0 scored, 2 reused (already in {out} under these settings: "
                           "tasks cf_capitals_mc, --limit 2, --backend hf, --model_args dtype=auto,device=cpu")
    assert last.endswith("chat template off, knowledge probe off), 0 failed")

    assert _sweep(run_dir["lora"], out, "--quiet") == 0
    quiet = capfd.readouterr()
    assert quiet.out == "" and quiet.err == ""


def test_quiet_keeps_the_failures(run_dir, tmp_path, capfd):  # noqa: F811
    run = tmp_path / "run"
    shutil.copytree(run_dir["lora"], run)
    (run / "step_20" / "adapter_model.safetensors").write_bytes(b"\x00not a safetensors file")
    assert _sweep(run, tmp_path / "out", "--quiet") == 1
    printed = capfd.readouterr()
    assert printed.out == ""
    errors = printed.err.strip().splitlines()
    assert "step_20" in errors[0] and errors[0].startswith("cf-tasks: error: ")
    assert errors[-1].startswith("cf-tasks: 1 checkpoint(s) failed")


def test_the_summary_table_prints_no_negative_zero():
    row = {"peak_step": 1, "peak": 0.0, "final": 0.0, "drop": -0.0, "drop_ci_low": -0.0, "drop_ci_high": -0.0001,
           "mcnemar_p": 1.0, "flips_to_context": 0, "flips_to_parametric": 0, "verdict": "v"}
    table = format_summary({"cf_capitals": row})
    assert "-0.000" not in table and "[+0.000,+0.000]" in table
