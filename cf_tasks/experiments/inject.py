"""A positive control for context-parametric inversion: inject knowledge, then fine-tune C+S-heavy.

Goyal et al. ("Context-Parametric Inversion: Why Instruction Finetuning May Not Actually Improve
Context Reliance", ICLR 2025) trace the fall of context reliance to C+S points: training points whose
subject predicts the answer better than the context (section 4.3, equation 7). A small model knows
few facts, so its "known" facts act as C points and no fall is predicted. This design (the default of
``cf-tasks experiment inversion``) makes the precondition true before it looks for the outcome:

1. **facts** (``OUT/data``; ``inject_facts``): every candidate fact is asked closed-book of the base
   model (the knowledge probe's generation and scorer). Among the facts it does not know: T
   (training-part facts, to become C+S points), E (held-out facts of the evaluated tasks, the probe
   group) and N (held-out facts never taught, the control group).
2. **inject** (``OUT/phase_a``): full fine-tuning on T and E closed-book until they are recalled,
   then a gate written to ``gate.json`` before anything else runs: recall on T and E, mean ``M_C``
   on E, N unchanged, and T's closed-book loss below the context-only loss of C points (equation 7).
   A gate that fails stops the study and names the figure.
3. **train** (``OUT/runs/<arm>-seed<N>``): full fine-tuning from the phase-A model. ``cs_heavy``
   (C+S : C = 3 : 1, plus closed-book S points of T) and ``c_only`` (the control: the theory
   predicts a rise and no fall). At every checkpoint, in the process: ``M_C`` (the paper's equation
   14, by log-likelihood of both answers under the counterfactual passage) and closed-book recall on
   E, N and on T's own counterfactual items, and the loss of C, C+S and S points (``inject_measure``).
   Resumable: the model and optimizer state are kept at the last checkpoint.
4. **sweep** (``OUT/sweeps``): ``cf-tasks sweep`` of the saved checkpoints on the held-out items.

The report (``inject_report``) reads only the CSVs these parts write.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import CFTasksError
from ..files import atomic_write, tmp_name
from ..results import rows_to_csv
from .inject_facts import FAMILIES, GROUPS, check_fact_counts, choose_groups, closed_book, known_of, load_groups
from .inject_measure import LOSS_COLUMNS, MEASURE_COLUMNS, MEASURED, loss_rows, measure_facts
from .lm import batches, greedy_answers, kind_counts, load_model, per_example_loss
from .study_folder import StudyError, claim_study_folder, read_jsonl, run_name, settings_of, store_json

ARMS = {
    "cs_heavy": "C+S : C = 3 : 1 plus closed-book S points of the injected training facts",
    "c_only": "C points only (the control: a rise and no fall predicted)",
    "augmented": "the cs_heavy mix plus counterfactual points (section 6)",
}
FULL_TASKS = ("cf_capitals",)  # swept on every held-out item; the other tasks on --limit items
RECALLED = ("E", "N")  # the groups whose closed-book recall phase B measures at every checkpoint
GATE_KEYS = ("gate_recall", "gate_mc", "gate_n_shift")


class GateFailed(CFTasksError):
    """Phase A did not make its facts C+S facts; the study stops (exit 1)."""

    exit_code = 1


@dataclass
class InjectConfig:
    output_path: Path
    model: str | None = None
    arms: tuple[str, ...] = ("cs_heavy", "c_only")
    seeds: tuple[int, ...] = (0,)
    t_facts: int = 150
    n_facts: int = 40
    inject_lr: float = 5e-5
    inject_min_epochs: int = 6
    inject_max_epochs: int = 14
    t_epochs: int | None = None  # T is taught in the last t_epochs of the first inject_min_epochs (None: all)
    lr: float = 1e-5
    steps: int = 160
    save_every: int = 16
    sweep_every: int = 48  # the sweep scores step 0, every sweep_every steps and the last step
    batch_size: int = 8
    c_share: float = 0.25  # C points in cs_heavy (C+S : C = 3 : 1)
    s_share: float = 0.25  # closed-book S points of T added to cs_heavy, as a share of T
    loss_probe: int = 32
    gate_recall: float = 0.95
    gate_mc: float = 0.35
    gate_n_shift: float = 0.10
    gate_cs: bool = True  # require the C+S condition (off only in --quick, where a random model has no memory)
    tasks: tuple[str, ...] = FAMILIES
    limit: int | None = 40  # held-out items of each swept task other than cf_capitals (swept in full)
    sweep_batch_size: int = 8
    data_seed: int = 0
    max_new_tokens: int = 32  # closed-book answers of the knowledge probe and the gate (the sweep's own cap)
    measure_tokens: int = 16  # closed-book answers at phase B's checkpoints (E and N; answers are short by then)
    quick: bool = False
    report_path: Path | None = None
    sweep: bool = True
    finish: bool = False  # close each run at its last checkpoint instead of training further

    @property
    def report_dir(self) -> Path:
        return Path(self.report_path) if self.report_path else Path(self.output_path) / "report"

    def settings(self) -> dict:
        """What moves a number of the study: a rerun into the same folder must match these."""
        settings = settings_of(self)
        if settings.get("t_epochs") is None:  # the default, absent from folders made before it existed
            settings.pop("t_epochs", None)
        return settings


QUICK = dict(t_facts=6, n_facts=3, inject_min_epochs=1, inject_max_epochs=1, steps=4, save_every=2, sweep_every=4,
             batch_size=4, loss_probe=3, limit=3, tasks=("cf_capitals",), max_new_tokens=8, measure_tokens=8,
             quick=True, gate_recall=0.0, gate_mc=1.0, gate_n_shift=1.0, gate_cs=False)


# ------------------------------------------------------------------------------------ checks

def check_config(cfg: InjectConfig) -> None:
    """Every setting, before any work: one line naming the setting and the fix (exit 2)."""
    unknown = [a for a in cfg.arms if a not in ARMS]
    if unknown or not cfg.arms:
        raise StudyError(f"--arms: unknown arm {', '.join(unknown) or '(none given)'}; choose from {', '.join(ARMS)}")
    for key in GATE_KEYS:
        value = getattr(cfg, key)
        if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
            raise StudyError(f"--{key} {value}: a gate threshold is a number between 0 and 1")
    for key in ("lr", "inject_lr"):
        value = getattr(cfg, key)
        if not (math.isfinite(value) and 0 < value < 1):
            raise StudyError(f"--{key} {value}: a learning rate is a finite number between 0 and 1, e.g. 1e-5")
    for key in ("steps", "save_every", "sweep_every", "batch_size", "t_facts", "n_facts", "inject_min_epochs",
                "inject_max_epochs"):
        if getattr(cfg, key) < 1:
            raise StudyError(f"--{key} {getattr(cfg, key)}: must be a positive integer")
    if cfg.steps < cfg.save_every:
        raise StudyError(f"--steps {cfg.steps} is below the checkpoint interval --save_every {cfg.save_every}; "
                         "train at least one interval")
    if cfg.sweep_every % cfg.save_every:
        raise StudyError(f"--sweep_every {cfg.sweep_every}: must be a multiple of --save_every {cfg.save_every}")
    if cfg.inject_max_epochs < cfg.inject_min_epochs:
        raise StudyError("--inject_max_epochs is below --inject_min_epochs; raise it")
    if cfg.t_epochs is not None and not 1 <= cfg.t_epochs <= cfg.inject_min_epochs:
        raise StudyError(f"--t_epochs {cfg.t_epochs}: must be between 1 and the phase-A epochs "
                         f"({cfg.inject_min_epochs})")


def claim_folder(cfg: InjectConfig, model_id: str) -> None:
    """Write the study's settings record, or refuse a folder made with other settings (exit 2)."""
    claim_study_folder(Path(cfg.output_path), {"design": "inject", "model_id": model_id, **cfg.settings()})


# ------------------------------------------------------------------------------------- training

def _threads() -> None:
    import torch

    torch.set_num_threads(int(os.environ.get("CF_TASKS_THREADS", "1")))


def _step(model, tokenizer, optimizer, batch: list[dict]) -> float:
    model.train()
    losses = per_example_loss(model, tokenizer, batch)
    loss = losses.mean()
    if not math.isfinite(loss.item()):
        raise StudyError(f"the training loss is {loss.item()} (diverged); lower the learning rate")
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def _save_model(model, tokenizer, folder: Path) -> None:
    tmp = folder.parent / tmp_name(folder.name)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)


def inject(cfg: InjectConfig, base: Path, log=print) -> Path:
    """Phase A: teach T and E closed-book (full fine-tuning) into ``OUT/phase_a/model``."""
    import torch

    phase = Path(cfg.output_path) / "phase_a"
    model_dir = phase / "model"
    if (phase / "inject.json").is_file():
        return model_dir
    _threads()
    phase.mkdir(parents=True, exist_ok=True)
    points = read_jsonl(Path(cfg.output_path) / "data" / "inject.jsonl")
    groups = load_groups(cfg.output_path)
    taught = groups["T"] + groups["E"]
    torch.manual_seed(cfg.data_seed)
    model, tokenizer = load_model(base)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.inject_lr, weight_decay=0.0)
    t_ids = {p["fact_id"] for p in groups["T"]}
    # --t_epochs: T joins in the last t_epochs of the first inject_min_epochs and stays (weaker memory of T)
    t_from = 1 if cfg.t_epochs is None else cfg.inject_min_epochs - cfg.t_epochs + 1
    rows, epoch, steps, recall, start = [], 0, 0, 0.0, time.perf_counter()
    while epoch < cfg.inject_max_epochs:
        mine = points if epoch + 1 >= t_from else [p for p in points if p.get("fact_id") not in t_ids]
        per_epoch = math.ceil(len(mine) / cfg.batch_size)
        losses = [_step(model, tokenizer, optimizer, b)
                  for b in batches(mine, per_epoch, cfg.batch_size, f"inject:{cfg.data_seed}:{epoch}")]
        epoch += 1
        steps += per_epoch
        row = {"epoch": epoch, "steps": steps, "loss": round(sum(losses) / len(losses), 6), "recall": ""}
        if epoch >= cfg.inject_min_epochs and (epoch - cfg.inject_min_epochs) % 2 == 0:
            model.eval()
            said = greedy_answers(model, tokenizer, [closed_book(p) for p in taught], log=lambda *a, **k: None,
                                  max_new_tokens=cfg.max_new_tokens)
            recall = sum(known_of(p, a) for p, a in zip(taught, said)) / max(1, len(taught))
            row["recall"] = round(recall, 4)
        rows.append(row)
        log(f"  phase A: epoch {epoch}, loss {row['loss']:.4f}, recall {row['recall']}, "
            f"{time.perf_counter() - start:.0f} s")
        if row["recall"] != "" and recall >= cfg.gate_recall:
            break
    _save_model(model, tokenizer, model_dir)
    atomic_write(phase / "epochs.csv", rows_to_csv(rows, ("epoch", "steps", "loss", "recall")))
    store_json(phase / "inject.json", {"epochs": epoch, "steps": steps, "points": len(points),
                                       "seconds": round(time.perf_counter() - start, 1)})
    return model_dir


def gate(cfg: InjectConfig, base: Path, injected: Path, log=print) -> dict:
    """Measure the gate's figures on the base and the phase-A model (once), judge them by the
    study's thresholds, and write both to ``OUT/phase_a/gate.json``."""
    phase = Path(cfg.output_path) / "phase_a"
    path = phase / "gate.json"
    if path.is_file():
        result = judge(cfg, json.loads(path.read_text())["figures"])
        store_json(path, result)
        return result
    _threads()
    groups = load_groups(cfg.output_path)
    probe = read_jsonl(Path(cfg.output_path) / "data" / "loss_probe.jsonl")
    figures, measured = {}, []
    at_base = {r["fact_id"]: r["answer"] for r in read_jsonl(Path(cfg.output_path) / "data" / "base_known.jsonl")}
    for label, folder in (("base", base), ("phase_a", injected)):
        model, tokenizer = load_model(folder)
        rows = measure_facts(model, tokenizer, groups, label, 0, cfg.max_new_tokens,
                             said=at_base if label == "base" else None,
                             recall_groups=GROUPS)
        measured += rows
        losses = {r["kind"]: r["loss"] for r in loss_rows(model, tokenizer, probe, label, 0)}
        for g in GROUPS:
            mine = [r for r in rows if r["group"] == g]
            figures[f"{label}_recall_{g}"] = round(sum(r["known"] for r in mine) / max(1, len(mine)), 4)
            if g in MEASURED:
                figures[f"{label}_mc_{g}"] = round(sum(r["mc"] for r in mine) / max(1, len(mine)), 4)
        figures[f"{label}_loss_S_of_T"] = losses.get("S")
        figures[f"{label}_loss_C"] = losses.get("C")
        figures[f"{label}_loss_CS"] = losses.get("CS")
    atomic_write(phase / "measure.csv", rows_to_csv(measured, MEASURE_COLUMNS))
    result = judge(cfg, figures)
    store_json(path, result)
    return result


def judge(cfg: InjectConfig, figures: dict) -> dict:
    """The gate's checks of the measured ``figures`` at the study's thresholds."""
    checks = {
        "recall_T": (figures["phase_a_recall_T"] >= cfg.gate_recall, f">= {cfg.gate_recall}"),
        "recall_E": (figures["phase_a_recall_E"] >= cfg.gate_recall, f">= {cfg.gate_recall}"),
        "mc_E": (figures["phase_a_mc_E"] <= cfg.gate_mc, f"<= {cfg.gate_mc}"),
        "n_unchanged": (abs(figures["phase_a_mc_N"] - figures["base_mc_N"]) <= cfg.gate_n_shift
                        and figures["phase_a_recall_N"] - figures["base_recall_N"] <= cfg.gate_n_shift,
                        f"M_C and recall within {cfg.gate_n_shift} of the base model"),
        "cs_condition": (not cfg.gate_cs or (figures["phase_a_loss_S_of_T"] or 0) < (figures["phase_a_loss_C"] or 0),
                         "closed-book loss of T below the context-only loss of C points"
                         + ("" if cfg.gate_cs else " (not required: --quick)")),
    }
    return {"figures": figures, "checks": {k: {"met": bool(v[0]), "needs": v[1]} for k, v in checks.items()},
            "met": all(v[0] for v in checks.values())}


def gate_message(result: dict) -> str:
    failed = [f"{k} ({v['needs']})" for k, v in result["checks"].items() if not v["met"]]
    return "the phase-A gate failed: " + "; ".join(failed)


def train_arm(cfg: InjectConfig, arm: str, seed: int, injected: Path, log=print) -> Path:
    """Phase B for one arm and seed: full fine-tuning from the phase-A model, measured at every
    checkpoint, resumable from the last one (``state/``)."""
    import torch

    out = Path(cfg.output_path)
    run = run_name(arm, seed)
    run_dir = out / "runs" / run
    if (run_dir / "run.json").is_file():
        return run_dir
    _threads()
    run_dir.mkdir(parents=True, exist_ok=True)
    groups = load_groups(out)
    probe = read_jsonl(out / "data" / "loss_probe.jsonl")
    points = read_jsonl(out / "data" / f"mix_{arm}.jsonl")
    plan = batches(points, cfg.steps, cfg.batch_size, seed)
    state = run_dir / "state"
    torch.manual_seed(seed)
    if (state / "state.json").is_file():
        saved = json.loads((state / "state.json").read_text())
        model, tokenizer = load_model(state / "model")
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        optimizer.load_state_dict(torch.load(state / "optimizer.pt", weights_only=True))
        first, measured, losses = saved["step"], saved["measure"], saved["loss"]
        before = saved.get("seconds", 0.0)
        log(f"  {run}: resumed at step {first}")
    else:
        model, tokenizer = load_model(injected)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        first, before, losses = 0, 0.0, loss_rows(model, tokenizer, probe, run, 0)
        measured = measure_facts(model, tokenizer, groups, run, 0, cfg.measure_tokens, recall_groups=RECALLED)
        _link_model(injected, run_dir / "checkpoint-0")
    start = time.perf_counter()
    for step in range(first + 1, cfg.steps + 1):
        batch = plan[step - 1]
        value = _step(model, tokenizer, optimizer, batch)
        losses.append({"run": run, "step": step, "split": "train", "kind": "all", "loss": round(value, 6),
                       "n": len(batch)})
        if step % cfg.save_every == 0 or step == cfg.steps:
            losses += loss_rows(model, tokenizer, probe, run, step)
            measured += measure_facts(model, tokenizer, groups, run, step, cfg.measure_tokens, recall_groups=RECALLED)
            if step % cfg.sweep_every == 0 or step == cfg.steps:
                _save_model(model, tokenizer, run_dir / f"checkpoint-{step}")
            _save_state(model, tokenizer, optimizer, state, step, measured, losses,
                        round(before + time.perf_counter() - start, 1))
            known_e = [r for r in measured if r["step"] == step and r["group"] == "E"]
            log(f"  {run}: step {step}/{cfg.steps}, loss {value:.3f}, M_C(E) "
                f"{sum(r['mc'] for r in known_e) / max(1, len(known_e)):.3f}, "
                f"{(time.perf_counter() - start) / (step - first):.1f} s/step")
    atomic_write(run_dir / "measure.csv", rows_to_csv(measured, MEASURE_COLUMNS))
    atomic_write(run_dir / "loss.csv", rows_to_csv(losses, LOSS_COLUMNS))
    store_json(run_dir / "run.json", {"arm": arm, "seed": seed, "steps": cfg.steps, "lr": cfg.lr,
                                      "batch_size": cfg.batch_size, "points": kind_counts(points),
                                      "seconds": round(before + time.perf_counter() - start, 1)})
    shutil.rmtree(state, ignore_errors=True)
    return run_dir


def finish_early(cfg: InjectConfig, arm: str, seed: int, log=print) -> Path | None:
    """Close a run at its last checkpoint (``--finish``, with its training process stopped): its
    files as a finished run's, the step it reached beside the steps planned, and that checkpoint's
    model kept for the sweep. None when the run has no checkpoint yet."""
    run = run_name(arm, seed)
    run_dir = Path(cfg.output_path) / "runs" / run
    state = run_dir / "state"
    if (run_dir / "run.json").is_file():
        return run_dir
    if not (state / "state.json").is_file():
        return None
    saved = json.loads((state / "state.json").read_text())
    step = saved["step"]
    _link_model(state / "model", run_dir / f"checkpoint-{step}")
    points = read_jsonl(Path(cfg.output_path) / "data" / f"mix_{arm}.jsonl")
    atomic_write(run_dir / "measure.csv", rows_to_csv(saved["measure"], MEASURE_COLUMNS))
    atomic_write(run_dir / "loss.csv", rows_to_csv(saved["loss"], LOSS_COLUMNS))
    store_json(run_dir / "run.json", {"arm": arm, "seed": seed, "steps": step, "planned_steps": cfg.steps,
                                      "lr": cfg.lr, "batch_size": cfg.batch_size, "points": kind_counts(points),
                                      "seconds": saved.get("seconds")})
    shutil.rmtree(state, ignore_errors=True)
    log(f"  {run}: closed at step {step} of {cfg.steps}")
    return run_dir


def _link_model(src: Path, dest: Path) -> None:
    """``dest`` holds the same files as ``src`` (hard links where the disk allows, else copies)."""
    if dest.exists():
        return
    tmp = dest.parent / tmp_name(dest.name)
    tmp.mkdir(parents=True)
    for f in Path(src).iterdir():
        if f.is_file():
            try:
                os.link(f, tmp / f.name)
            except OSError:
                shutil.copy2(f, tmp / f.name)
    tmp.rename(dest)


def _save_state(model, tokenizer, optimizer, state: Path, step: int, measured: list, losses: list,
                seconds: float) -> None:
    import torch

    tmp = state.parent / tmp_name("state")
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp / "model")
    tokenizer.save_pretrained(tmp / "model")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, "measure": measured, "loss": losses,
                                                "seconds": seconds}))
    old = state.parent / tmp_name("state-old")
    if state.exists():
        state.rename(old)
    tmp.rename(state)
    shutil.rmtree(old, ignore_errors=True)


def sweep_arm(cfg: InjectConfig, run_dir: Path, chat: bool) -> int:
    """``cf-tasks sweep`` of one run's saved checkpoints into ``OUT/sweeps``: every held-out item of
    ``cf_capitals``, ``--limit`` held-out items of the other tasks (of every task with ``--quick``);
    returns the failed checkpoints."""
    from ..sweep import SweepConfig, run_sweep

    failed = 0
    for task in cfg.tasks:
        sweep = SweepConfig(run_dir=run_dir, tasks=[task], output_path=Path(cfg.output_path) / "sweeps",
                            backend="hf", limit=None if task in FULL_TASKS and not cfg.quick else cfg.limit,
                            batch_size=cfg.sweep_batch_size, include_base=False, device="cpu",
                            apply_chat_template=chat, metadata={"split": "heldout"}, knowledge=True, agree=True,
                            attention=False)
        failed += run_sweep(sweep)
    return failed


# ------------------------------------------------------------------------------------- the study

def base_model(cfg: InjectConfig) -> Path:
    if cfg.model:
        return Path(cfg.model).resolve()
    from ..default_model import default_model_path

    return default_model_path()


def run_study(cfg: InjectConfig, log=print) -> int:
    """Every part in order; returns the number of failed sweep checkpoints. Raises GateFailed."""
    from ..checkpoints import folder_identity

    check_config(cfg)
    check_fact_counts(cfg)
    base = base_model(cfg)
    claim_folder(cfg, folder_identity(base))
    counts = choose_groups(cfg, base, log)
    log(f"facts: {counts}")
    injected = inject(cfg, base, log)
    result = gate(cfg, base, injected, log)
    log("gate: " + ", ".join(f"{k} {'met' if v['met'] else 'FAILED'}" for k, v in result["checks"].items()))
    if not result["met"]:
        raise GateFailed(gate_message(result) + f" (figures in {Path(cfg.output_path) / 'phase_a' / 'gate.json'})")
    from transformers import AutoTokenizer

    chat = bool(getattr(AutoTokenizer.from_pretrained(injected), "chat_template", None))
    failed = 0
    for seed in cfg.seeds:
        for arm in cfg.arms:
            if cfg.finish:
                run_dir = finish_early(cfg, arm, seed, log)
                if run_dir is None:
                    log(f"  {run_name(arm, seed)}: no checkpoint yet, nothing to close")
                    continue
            else:
                run_dir = train_arm(cfg, arm, seed, injected, log)
            if cfg.sweep:
                failed += sweep_arm(cfg, run_dir, chat)
    return failed
