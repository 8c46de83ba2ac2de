"""`cf-tasks sweep` / `report` over a run folder built in the test: tiny full checkpoints, LoRA
adapters, a corrupt and a half-written checkpoint."""

import csv
import json
import shutil

import pandas as pd
import pytest

from cf_tasks.cli import main
from cf_tasks.evaluate import run_lm_eval
from cf_tasks.checkpoints import discover
from cf_tasks.sweep import SweepConfig, run_sweep

TASKS = "cf_capitals_mc,cf_quotes"
LIMIT = "3"


def _make_full(src, dest, seed):
    """A full checkpoint: the tiny model's config and tokenizer with re-randomised weights."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src)
    torch.manual_seed(seed)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)
    model.save_pretrained(dest)
    for f in src.glob("tokenizer*"):
        shutil.copy(f, dest / f.name)
    for f in src.glob("special_tokens_map.json"):
        shutil.copy(f, dest / f.name)


def _make_lora(base, dest, seed, r=4):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base)
    peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(seed)
    for name, p in peft_model.named_parameters():
        if "lora_" in name:
            torch.nn.init.normal_(p, std=1.0)
    peft_model.save_pretrained(dest)
    cfg = json.loads((dest / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(base)
    (dest / "adapter_config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def run_dir(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    full = root / "full"
    full.mkdir()
    for step, seed in ((100, 1), (200, 2), (300, 3)):
        _make_full(tiny_model, full / f"checkpoint-{step}", seed)
    corrupt = full / "checkpoint-400"
    shutil.copytree(full / "checkpoint-100", corrupt)
    (corrupt / "model.safetensors").write_bytes(b"\x00garbage, not a safetensors file")
    half = full / "checkpoint-500"
    half.mkdir()
    shutil.copy(full / "checkpoint-100" / "config.json", half / "config.json")  # weights never written
    (full / "logs").mkdir()  # not a checkpoint: ignored

    lora = root / "lora"
    lora.mkdir()
    for step, seed in ((10, 11), (20, 12)):
        _make_lora(tiny_model, lora / f"step_{step}", seed)
    return {"full": full, "lora": lora, "base": tiny_model}


def _csv(path):
    return list(csv.DictReader(path.open()))


def test_discovery_orders_and_classifies(run_dir):
    found = discover(run_dir["full"])
    assert [c.step for c in found] == [100, 200, 300, 400, 500]
    assert [c.error is None for c in found] == [True, True, True, True, False]  # corruption shows at load
    assert "no weights" in found[-1].error and str(found[-1].path) in found[-1].error
    lora = discover(run_dir["lora"])
    assert [(c.kind, c.lora_rank, c.base) for c in lora] == [("lora", 4, str(run_dir["base"]))] * 2


def test_full_sweep_rows_failures_and_resume(run_dir, tmp_path, capsys, made_backends):
    out = tmp_path / "out"
    args = ["sweep", str(run_dir["full"]), "--tasks", TASKS, "--output_path", str(out), "--limit", LIMIT,
            "--backend", "hf"]
    assert main(args) == 1  # two checkpoints failed
    assert made_backends[0].swaps == 2  # checkpoint-200 and -300 went into checkpoint-100's model
    err = capsys.readouterr().err
    assert "checkpoint-400/model.safetensors: corrupt weights file" in err
    assert "checkpoint-500: config.json but no weights" in err

    frame = pd.read_csv(out / "sweep.csv")
    assert list(frame.columns) == ["checkpoint", "step", "task", "metric", "value", "stderr", "n", "backend",
                                   "model", "version", "run", "settings", "limit", "apply_chat_template", "metadata",
                                   "checkpoint_id"]
    assert sorted(frame["step"].unique()) == [100, 200, 300]
    assert set(frame["metric"]) >= {"counterfactual_acc", "parametric_acc", "acc", "context_prob"}
    assert (frame["n"] == 3).all() and (frame["backend"] == "hf").all()

    # Swapping weights into the loaded model gives what a fresh load of that checkpoint gives.
    fresh = run_lm_eval("hf", TASKS.split(","), model_args=f"pretrained={run_dir['full'] / 'checkpoint-200'},"
                        "dtype=float32,device=cpu", limit=3)["results"]
    row = frame[(frame.step == 200) & (frame.task == "cf_capitals_mc") & (frame.metric == "context_prob")]
    assert row["value"].item() == pytest.approx(fresh["cf_capitals_mc"]["context_prob,none"], abs=1e-6)
    probs = frame[(frame.task == "cf_capitals_mc") & (frame.metric == "context_prob")]["value"]
    assert probs.nunique() == 3  # each checkpoint really was a different model

    manifest = json.loads((out / "manifest.json").read_text())
    status = {e["name"]: e["status"] for e in manifest["checkpoints"].values()}
    assert status == {"checkpoint-100": "done", "checkpoint-200": "done", "checkpoint-300": "done",
                      "checkpoint-400": "failed", "checkpoint-500": "failed"}
    sweep_json = json.loads((out / "sweep.json").read_text())
    assert {f["checkpoint"] for f in sweep_json["failures"]} == {"checkpoint-400", "checkpoint-500"}
    assert (out / "inversion.png").stat().st_size > 1000
    assert (out / "checkpoints" / "checkpoint-100" / "results.json").is_file()
    assert list((out / "checkpoints" / "checkpoint-100").glob("samples_cf_quotes.jsonl"))

    # Resume: nothing finished is redone; a re-saved checkpoint is.
    before = (out / "checkpoints" / "checkpoint-200" / "results.json").stat().st_mtime_ns
    ckpt300 = run_dir["full"] / "checkpoint-300" / "config.json"
    ckpt300.write_text(ckpt300.read_text() + "\n")  # re-saved: new content (the identity is the content)
    assert main(args) == 1
    assert (out / "checkpoints" / "checkpoint-200" / "results.json").stat().st_mtime_ns == before
    manifest2 = json.loads((out / "manifest.json").read_text())
    redone = [e["name"] for e in manifest2["checkpoints"].values() if e.get("mtime") != manifest["checkpoints"].get(
        next(k for k, v in manifest["checkpoints"].items() if v["name"] == e["name"]), {}).get("mtime")]
    assert redone == ["checkpoint-300"]


def test_lora_sweep_with_base_and_shards_merge(run_dir, tmp_path):
    outs = []
    for shard in ("0/2", "1/2"):
        out = tmp_path / f"shard{shard[0]}"
        assert main(["sweep", str(run_dir["lora"]), "--tasks", "cf_capitals_mc", "--output_path", str(out),
                     "--limit", LIMIT, "--backend", "hf", "--include_base", "--shard", shard]) == 0
        outs.append(out)
    steps = [sorted(pd.read_csv(o / "sweep.csv")["step"].unique()) for o in outs]
    assert steps == [[0, 20], [10]]  # base (step 0), step_10, step_20 dealt round-robin
    merged = tmp_path / "merged"
    assert main(["report", *map(str, outs), "--output_path", str(merged)]) == 0
    frame = pd.read_csv(merged / "sweep.csv")
    assert sorted(frame["step"].unique()) == [0, 10, 20]
    probs = frame[frame.metric == "context_prob"].set_index("step")["value"]
    assert probs.nunique() == 3  # adapters change the model; unloading restores the base
    # Each adapter scored in the shared engine equals a separate run of that adapter.
    fresh = run_lm_eval("hf", ["cf_capitals_mc"], model_args=f"pretrained={run_dir['base']},peft="
                        f"{run_dir['lora'] / 'step_10'},dtype=float32,device=cpu", limit=3)["results"]
    assert probs[10] == pytest.approx(fresh["cf_capitals_mc"]["context_prob,none"], abs=1e-6)
    assert (merged / "inversion.png").is_file()


def _responses(samples):
    return {s["doc_id"]: s["resps"] for s in samples}


def test_lora_group_generates_adapters_together_with_the_answers_of_separate_runs(run_dir, tmp_path, made_backends):
    out = tmp_path / "grouped"
    cfg = SweepConfig(run_dir=run_dir["lora"], tasks=["cf_capitals"], output_path=out, backend="hf", limit=4,
                      batch_size=2, device="cpu", lora_group=4)
    assert run_sweep(cfg, log=lambda *a, **k: None) == 0
    # Both adapters were generated in the first adapter's batches (4 items / batch 2 = 2 batches);
    # the second adapter's lm-eval run got its answers back for those same 2 batches.
    assert made_backends[0].lm.stats == {"group_batches": 2, "reused_batches": 2}
    grouped = {}
    for step in (10, 20):
        lines = (out / "checkpoints" / f"step_{step}" / "samples_cf_capitals.jsonl").read_text().splitlines()
        grouped[step] = _responses(json.loads(line) for line in lines)
        fresh = run_lm_eval("hf", ["cf_capitals"], model_args=f"pretrained={run_dir['base']},peft="
                            f"{run_dir['lora'] / f'step_{step}'},dtype=float32,device=cpu", limit=4,
                            batch_size=2, log_samples=True)
        assert grouped[step] == _responses(fresh["samples"]["cf_capitals"]), step
    assert grouped[10] != grouped[20]  # the adapters answer differently, so a mix-up would show


def test_a_corrupt_adapter_in_a_group_fails_alone(run_dir, tmp_path, made_backends, capsys):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copytree(run_dir["lora"] / "step_10", run / "step_10")
    shutil.copytree(run_dir["lora"] / "step_10", run / "step_15")
    (run / "step_15" / "adapter_model.safetensors").write_bytes(b"\x00not safetensors")
    shutil.copytree(run_dir["lora"] / "step_20", run / "step_20")
    out = tmp_path / "out"
    cfg = SweepConfig(run_dir=run, tasks=["cf_quotes"], output_path=out, backend="hf", limit=2, device="cpu")
    assert run_sweep(cfg) == 1
    manifest = json.loads((out / "manifest.json").read_text())["checkpoints"]
    status = {e["name"]: e["status"] for e in manifest.values()}
    assert status == {"step_10": "done", "step_15": "failed", "step_20": "done"}
    assert "step_15" in capsys.readouterr().err
    # step_10 and step_20 were still generated together, past the corrupt one.
    assert made_backends[0].lm.stats["group_batches"] == made_backends[0].lm.stats["reused_batches"] > 0


def test_an_adapter_that_fails_to_load_leaves_its_mates_their_own_configs(run_dir, tmp_path, made_backends):
    # peft registers an adapter's config before loading its weights: a mate whose weights fail to
    # load must not leave its config to the next mate (same rank here, a different scaling).
    run = tmp_path / "run"
    run.mkdir()
    shutil.copytree(run_dir["lora"] / "step_10", run / "step_10")
    bad = run / "step_15"
    _make_lora(run_dir["base"], bad, seed=13, r=2)  # weights open, but their rank is not the config's
    cfg = json.loads((bad / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps({**cfg, "r": 4}))
    scaled = run / "step_20"
    shutil.copytree(run_dir["lora"] / "step_20", scaled)
    cfg = json.loads((scaled / "adapter_config.json").read_text())
    (scaled / "adapter_config.json").write_text(json.dumps({**cfg, "lora_alpha": cfg["lora_alpha"] * 64}))
    out = tmp_path / "out"
    assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals"], output_path=out, backend="hf", limit=3,
                                 batch_size=3, device="cpu"), log=lambda *a, **k: None) == 1
    status = {e["name"]: e["status"] for e in json.loads((out / "manifest.json").read_text())["checkpoints"].values()}
    assert status == {"step_10": "done", "step_15": "failed", "step_20": "done"}
    # step_20 was generated with step_10 and kept its place while step_15 failed on its own.
    assert made_backends[0].lm.stats == {"group_batches": 1, "reused_batches": 1}
    lines = (out / "checkpoints" / "step_20" / "samples_cf_capitals.jsonl").read_text().splitlines()
    fresh = run_lm_eval("hf", ["cf_capitals"], model_args=f"pretrained={run_dir['base']},peft={scaled},dtype=float32,"
                        "device=cpu", limit=3, batch_size=3, log_samples=True)
    assert _responses(json.loads(line) for line in lines) == _responses(fresh["samples"]["cf_capitals"])
    unscaled = run_lm_eval("hf", ["cf_capitals"], model_args=f"pretrained={run_dir['base']},peft="
                           f"{run_dir['lora'] / 'step_20'},dtype=float32,device=cpu", limit=3, batch_size=3,
                           log_samples=True)
    # The scaling shows in the answers, so step_20 scored with another adapter's config would fail.
    assert _responses(fresh["samples"]["cf_capitals"]) != _responses(unscaled["samples"]["cf_capitals"])


def test_a_resaved_adapter_is_scored_with_its_new_weights_under_watch(run_dir, tmp_path, monkeypatch):
    import cf_tasks.sweep as sweep

    run = tmp_path / "live"
    run.mkdir()
    for step in (10, 20):
        shutil.copytree(run_dir["lora"] / f"step_{step}", run / f"step_{step}")

    def resave(_seconds):  # between polls, training re-saves step_20 with step_10's weights
        shutil.copy(run_dir["lora"] / "step_10" / "adapter_model.safetensors", run / "step_20" / "adapter_model.safetensors")

    monkeypatch.setattr(sweep.time, "sleep", resave)
    out = tmp_path / "out"
    assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals"], output_path=out, backend="hf", limit=3,
                                 batch_size=3, device="cpu", watch=True, poll_interval=0, settle_seconds=0,
                                 max_polls=2), log=lambda *a, **k: None) == 0
    answers = {step: _responses(json.loads(line) for line in
                                (out / "checkpoints" / f"step_{step}" / "samples_cf_capitals.jsonl").open())
               for step in (10, 20)}
    assert answers[20] == answers[10]  # not the first poll's step_20, which was still loaded


def test_bad_run_folders_are_one_line_errors(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["sweep", str(empty), "--output_path", str(tmp_path / "o"), "--backend", "hf"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no checkpoint folders" in err and str(empty) in err
    assert main(["sweep", str(tmp_path / "missing"), "--output_path", str(tmp_path / "o")]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert main(["sweep", str(empty), "--output_path", str(tmp_path / "o"), "--shard", "2/2"]) == 2
    assert "I must be in 0..N-1" in capsys.readouterr().err


def test_duplicate_steps_and_missing_base_are_recorded(tmp_path, run_dir):
    run = tmp_path / "dups"
    run.mkdir()
    shutil.copytree(run_dir["full"] / "checkpoint-100", run / "checkpoint-7")
    shutil.copytree(run_dir["full"] / "checkpoint-100", run / "step_7")
    shutil.copytree(run_dir["lora"] / "step_10", run / "epoch_3")
    cfg = json.loads((run / "epoch_3" / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(tmp_path / "no_such_base")
    (run / "epoch_3" / "adapter_config.json").write_text(json.dumps(cfg))
    found = {c.name: c.error for c in discover(run)}
    assert "step 7 is claimed by 2 checkpoints" in found["checkpoint-7"] and "rename or remove" in found["step_7"]
    assert "base model" in found["epoch_3"] and "--base" in found["epoch_3"]
    failed = run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=tmp_path / "o", limit=2))
    assert failed == 3


def test_watch_skips_checkpoints_still_being_written(tmp_path, run_dir):
    run = tmp_path / "live"
    run.mkdir()
    shutil.copytree(run_dir["full"] / "checkpoint-100", run / "checkpoint-1")
    (run / "checkpoint-2").mkdir()
    shutil.copy(run_dir["full"] / "checkpoint-100" / "config.json", run / "checkpoint-2" / "config.json")
    (run / "checkpoint-2" / "model.safetensors.tmp").write_bytes(b"partial")
    out = tmp_path / "o"
    failed = run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=out, limit=2, watch=True,
                                   settle_seconds=0, poll_interval=0, max_polls=1))
    assert failed == 0  # the half-written checkpoint is waited for, not failed
    names = {e["name"] for e in json.loads((out / "manifest.json").read_text())["checkpoints"].values()}
    assert names == {"checkpoint-1"}
