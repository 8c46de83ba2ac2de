"""The first design of ``cf-tasks experiment inversion`` (``--design known_lora``): LoRA on known facts.

A fine-tuning study of context-parametric inversion (Goyal et al., ICLR 2025, sections 3, 4 and 6).
The paper finds that during instruction fine-tuning the reliance on a counterfactual context first
rises and then falls (section 3), traces the fall to training points whose context agrees with what
the model already knows (C+S points, section 4.3), and tries three mitigations: dropping those
points (the context-critical filter, section 4.3), counterfactual augmentation and updating only
the query and key matrices (section 6). This module runs that study on a small model, one command:

    cf-tasks experiment inversion --design known_lora --output_path OUT [--quick] [--arms ...] [--seeds ...]

Parts, each resumable (a stopped process keeps what it finished):

1. **data** (``OUT/data``): the training points of ``dataset_builders.training`` (training part
   of the subject split, disjoint from the evaluation's held-out part): C (invented entities whose
   passage states the answer), C+S (``CS``: a real fact stated by its passage), S (the same facts
   closed-book) and CF (a counterfactual passage and its answer). The base model answers every
   C+S / S fact closed-book, scored by the project's scorer as the knowledge probe scores it
   (``cf_tasks.scoring``); only the known facts are kept. Each arm's mix is written as Alpaca JSON
   Lines.
2. **train** (``OUT/runs/<arm>-seed<N>/checkpoint-<step>``): LoRA (peft) on the base model, a plain
   torch loop (AdamW, constant learning rate, fixed seed), the model's chat template, the loss on the
   answer tokens only. ``loss.csv`` holds each step's batch loss per kind of point (``split=train``)
   and, at every checkpoint, the loss of a fixed set of points per kind (``split=probe``). A run is
   written to a temp folder and renamed when complete, so a stopped run restarts from step 0.
3. **sweep** (``OUT/sweeps``): ``cf-tasks sweep`` of each run folder with the base model as step 0,
   on the held-out items of the tasks (``--metadata '{"split": "heldout"}'``), with the knowledge
   probe, the agreeing twins and ``context_attention``; the sweep's store keeps finished results.
4. **report** (``--report_path``, default ``OUT/report``; ``known_lora_report``): ``cf-tasks report``
   recomputes ``summary.csv`` from the store, then ``curves.csv``, ``summary.csv``, ``loss.csv``,
   ``data.csv``, ``timing.csv``, the plots and ``results.md`` are written. ``--report_only`` runs this
   part alone.

The arms: ``cs_heavy`` (the C+S-heavy mix, the paper's harmful case; two seeds), ``c_only``,
``qk_only`` (the main mix, LoRA on q_proj and k_proj), ``filtered`` (the main mix after
``cf-tasks filter-data --by loss``) and ``augmented`` (the main mix plus CF points).
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..files import atomic_write, tmp_name
from ..results import rows_to_csv
from .known_lora_report import LOSS_COLUMNS, build_report
from .lm import (KINDS, batches, greedy_answers, has_chat_template, is_known, kind_counts, load_model,
                 mean_loss_by_kind, per_example_loss)
from .study_folder import (StudyError, add_time, claim_study_folder, read_jsonl, run_name, settings_of, store_json,
                           write_jsonl)

ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
QK = ("q_proj", "k_proj")
MAIN_ARM = "cs_heavy"
TASKS = ("cf_capitals", "cf_world_facts", "cf_bio")  # knowledge-conflict tasks with a held-out part and twins


@dataclass(frozen=True)
class Arm:
    name: str
    what: str
    target_modules: tuple[str, ...] = ALL_LINEAR
    only_c: bool = False
    filtered: bool = False
    augmented: bool = False


ARMS = {a.name: a for a in (
    Arm(MAIN_ARM, "C+S-heavy mix (C : C+S : S = 1 : 2 : 1), the paper's harmful case"),
    Arm("c_only", "C points only (context-critical)", only_c=True),
    Arm("qk_only", "the main mix, LoRA on q_proj and k_proj only (section 6)", target_modules=QK),
    Arm("filtered", "the main mix after the context-critical filter (section 4.3)", filtered=True),
    Arm("augmented", "the main mix plus counterfactual points (section 6)", augmented=True),
)}
MAIN_MIX = {"C": 1, "CS": 2, "S": 1}


@dataclass
class StudyConfig:
    output_path: Path
    model: str | None = None  # None: the default model
    arms: tuple[str, ...] = tuple(ARMS)
    seeds: tuple[int, ...] = (0, 1)  # the main arm's seeds; the other arms use the first
    steps: int = 24
    save_every: int = 8
    batch_size: int = 4
    lr: float = 3e-4
    rank: int = 16
    lora_alpha: int = 32
    mix_size: int = 120  # points of the main mix (24 steps x 4 points: 0.8 of an epoch)
    augment_share: float = 0.25  # CF points added to the main mix, as a share of its size
    filter_drop: float = 0.25
    tasks: tuple[str, ...] = ("cf_capitals",)
    limit: int | None = 40
    sweep_batch_size: int = 8
    agree: bool = True
    attention: bool = True
    knowledge: bool = True  # the sweep's knowledge probe
    decide_known: bool = True  # keep only the C+S / S facts the base model knows closed-book
    # the families of the C+S / S facts (asked closed-book, one generation each): those evaluated
    fact_families: tuple[str, ...] = ("cf_capitals", "cf_world_facts")
    ask_facts: int = 160  # C+S / S facts asked closed-book (a seeded sample); the others are left out
    loss_probe: int = 16  # points per kind whose loss is measured at every checkpoint
    data_seed: int = 0
    alpha: float = 0.05  # the summary's significance level (cf-tasks sweep --alpha)
    report_path: Path | None = None
    quick: bool = False

    @property
    def report_dir(self) -> Path:
        return Path(self.report_path) if self.report_path else Path(self.output_path) / "report"


QUICK = dict(steps=4, save_every=2, batch_size=4, mix_size=24, limit=3, tasks=("cf_capitals",), arms=(MAIN_ARM,),
             seeds=(0,), loss_probe=3, decide_known=False, sweep_batch_size=4, quick=True)


def runs(cfg: StudyConfig) -> list[tuple[str, int]]:
    """(arm, seed) in the order they run: the main arm's first seed, the other arms, then the main
    arm's other seeds, so that what finishes first is the most informative."""
    first = cfg.seeds[0]
    order = [(a, first) for a in cfg.arms if a == MAIN_ARM] + [(a, first) for a in cfg.arms if a != MAIN_ARM]
    if MAIN_ARM in cfg.arms:
        order += [(MAIN_ARM, s) for s in cfg.seeds[1:]]
    return order


# ------------------------------------------------------------------------------------- the data

def _as_dict(point) -> dict:
    return dict(point) if isinstance(point, dict) else point.to_dict()


def load_points() -> dict[str, list[dict]]:
    """The training points of every kind, from the datasets' default build (the one the sweep evaluates)."""
    from dataset_builders.training import training_points

    return {kind: [_as_dict(p) for p in training_points(kind)] for kind in KINDS}


def decide_known(points: list[dict], generate: Callable[[list[str]], list[str]]) -> dict[str, dict]:
    """fact_id -> {"answer", "known"}: each fact's closed-book answer (``generate`` maps prompts to
    answers) and whether it states the fact. ``points`` are closed-book (S) points, one per fact."""
    facts = {}
    for p in points:
        facts.setdefault(p["fact_id"], p)
    ordered = list(facts.values())
    answers = generate(ordered)
    return {p["fact_id"]: {"answer": a, "known": is_known(a, p)} for p, a in zip(ordered, answers)}


def _sample(pool: list[dict], n: int, rng: random.Random) -> list[dict]:
    return rng.sample(pool, min(n, len(pool)))


def prepare_data(cfg: StudyConfig, base: Path, log=print) -> dict:
    """The training pools and each arm's mix under ``OUT/data`` (reused when present)."""
    data = Path(cfg.output_path) / "data"
    manifest_path = data / "manifest.json"
    if manifest_path.is_file():
        return json.loads(manifest_path.read_text())
    data.mkdir(parents=True, exist_ok=True)
    points = load_points()
    for kind in ("CS", "S"):
        points[kind] = [p for p in points[kind] if p["family"] in cfg.fact_families]
    pools = {k: list(v) for k, v in points.items()}
    manifest: dict = {"pool": {k: len(v) for k, v in points.items()}, "decide_known": cfg.decide_known}
    if cfg.decide_known:
        known_path = data / "known.jsonl"
        if known_path.is_file():
            known = {r["fact_id"]: r for r in read_jsonl(known_path)}
        else:
            model, tokenizer = load_model(base)
            start = time.perf_counter()
            asked = random.Random(cfg.data_seed).sample(points["S"], min(cfg.ask_facts, len(points["S"])))
            known = decide_known(asked, lambda ps: greedy_answers(model, tokenizer, ps, log=log))
            manifest["known_seconds"] = round(time.perf_counter() - start, 1)
            write_jsonl(known_path, [{"fact_id": f, **v} for f, v in known.items()])
        for kind in ("CS", "S"):
            pools[kind] = [p for p in pools[kind] if known.get(p["fact_id"], {}).get("known")]
        manifest["facts_asked"] = len(known)
        manifest["facts_known"] = sum(1 for v in known.values() if v["known"])
    manifest["kept"] = {k: len(v) for k, v in pools.items()}
    rng = random.Random(cfg.data_seed)
    total = sum(MAIN_MIX.values())
    share = {kind: round(cfg.mix_size * n / total) for kind, n in MAIN_MIX.items()}
    main = _sample(pools["C"], share["C"], rng) + _sample(pools["CS"], share["CS"], rng)
    # S: the closed-book points of facts whose C+S point is in the mix ("the same known facts")
    mixed = [p["fact_id"] for p in main if p["kind"] == "CS"]
    chosen = set(rng.sample(mixed, min(share["S"], len(mixed))))
    main += [p for p in pools["S"] if p["fact_id"] in chosen]
    rng.shuffle(main)
    mixes = {"main": main}
    main_c = [p for p in main if p["kind"] == "C"]
    rest_c = [p for p in pools["C"] if p["id"] not in {q["id"] for q in main_c}]
    mixes["c_only"] = main_c + _sample(rest_c, max(0, cfg.mix_size - len(main_c)), rng)
    mixes["augmented"] = main + _sample(pools["CF"], round(cfg.mix_size * cfg.augment_share), rng)
    rng.shuffle(mixes["augmented"])
    for name, mix in mixes.items():
        write_jsonl(data / f"{name}.jsonl", mix)
    manifest["mixes"] = {name: kind_counts(mix) for name, mix in mixes.items()}
    # The loss probe: the same fixed points of each kind for every arm (training points of the main mix).
    probe = []
    for kind in ("C", "CS", "S"):
        probe += [p for p in main if p["kind"] == kind][:cfg.loss_probe]
    write_jsonl(data / "loss_probe.jsonl", probe)
    store_json(manifest_path, manifest)
    return manifest


def filtered_mix(cfg: StudyConfig, base: Path, log=print) -> Path:
    """The main mix after ``cf-tasks filter-data --by loss`` (the context-critical filter)."""
    data = Path(cfg.output_path) / "data"
    out = data / "filtered"
    done = out / "kept.jsonl"
    if not done.is_file():
        folder = data / tmp_name("filtered")
        cmd = [sys.executable, "-m", "cf_tasks.cli", "filter-data", str(data / "main.jsonl"), "--model", str(base),
               "--drop", str(cfg.filter_drop), "--by", "loss", "--output_path", str(folder)]
        log("  " + " ".join(cmd[2:]))
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            shutil.rmtree(folder, ignore_errors=True)
            raise StudyError(f"filter-data failed ({proc.stderr.strip().splitlines()[-1:] or proc.returncode})")
        kept = _filter_output(folder)
        out.mkdir(parents=True, exist_ok=True)
        write_jsonl(done, kept)
        shutil.rmtree(folder, ignore_errors=True)
    return done


def _filter_output(folder: Path) -> list[dict]:
    """The kept examples of a filter-data output folder."""
    files = sorted(Path(folder).glob("*kept*.jsonl")) or sorted(Path(folder).glob("*.jsonl"))
    if not files:
        raise StudyError(f"filter-data wrote no JSON Lines file into {folder}")
    return read_jsonl(files[0])


def arm_points(cfg: StudyConfig, arm: Arm, base: Path, log=print) -> list[dict]:
    data = Path(cfg.output_path) / "data"
    if arm.only_c:
        return read_jsonl(data / "c_only.jsonl")
    if arm.augmented:
        return read_jsonl(data / "augmented.jsonl")
    if arm.filtered:
        return read_jsonl(filtered_mix(cfg, base, log))
    return read_jsonl(data / "main.jsonl")


# ------------------------------------------------------------------------------------- training

def train_run(cfg: StudyConfig, arm: Arm, seed: int, points: list[dict], probe: list[dict], base: Path,
              run_dir: Path, log=print) -> dict:
    """Train one LoRA run and save ``checkpoint-<step>`` adapters every ``save_every`` steps (and at
    the last step) into ``run_dir``, which appears only once the run is complete."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model, tokenizer = load_model(base)
    model = get_peft_model(model, LoraConfig(r=cfg.rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                             target_modules=list(arm.target_modules), task_type="CAUSAL_LM"))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    name = run_dir.name
    tmp = run_dir.parent / tmp_name(name)
    tmp.mkdir(parents=True)
    rows: list[dict] = []

    def row(step, split, kind, loss, n):
        rows.append({"run": name, "arm": arm.name, "seed": seed, "step": step, "split": split, "kind": kind,
                     "loss": round(loss, 6), "n": n})

    def measure(step):
        model.eval()
        for kind, (loss, n) in mean_loss_by_kind(model, tokenizer, probe).items():
            row(step, "probe", kind, loss, n)

    measure(0)
    start = time.perf_counter()
    for step, batch in enumerate(batches(points, cfg.steps, cfg.batch_size, seed), start=1):
        model.train()
        losses = per_example_loss(model, tokenizer, batch)
        losses.mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        for kind in KINDS:
            values = [l for p, l in zip(batch, losses.tolist()) if p["kind"] == kind]
            if values:
                row(step, "train", kind, sum(values) / len(values), len(values))
        if step % cfg.save_every == 0 or step == cfg.steps:
            model.save_pretrained(tmp / f"checkpoint-{step}")
            measure(step)
            log(f"  {name}: step {step}/{cfg.steps}, batch loss {losses.mean().item():.3f}, "
                f"{(time.perf_counter() - start) / step:.2f} s/step")
    atomic_write(tmp / "loss.csv", rows_to_csv(rows, LOSS_COLUMNS))
    store_json(tmp / "run.json", {"arm": arm.name, "seed": seed, "steps": cfg.steps, "save_every": cfg.save_every,
                                  "batch_size": cfg.batch_size, "lr": cfg.lr, "rank": cfg.rank,
                                  "lora_alpha": cfg.lora_alpha, "target_modules": list(arm.target_modules),
                                  "points": kind_counts(points), "base": str(base),
                                  "seconds": round(time.perf_counter() - start, 1)})
    if run_dir.exists():
        shutil.rmtree(run_dir)
    tmp.rename(run_dir)
    return json.loads((run_dir / "run.json").read_text())


# ------------------------------------------------------------------------------------------ sweep

def sweep_run(cfg: StudyConfig, run_dir: Path, chat: bool) -> int:
    """``cf-tasks sweep RUN --include_base --metadata '{"split": "heldout"}'`` into ``OUT/sweeps``;
    returns the number of failed checkpoints."""
    from ..sweep import SweepConfig, run_sweep

    sweep = SweepConfig(run_dir=run_dir, tasks=list(cfg.tasks), output_path=Path(cfg.output_path) / "sweeps",
                        backend="hf", limit=cfg.limit, batch_size=cfg.sweep_batch_size, include_base=True,
                        device="cpu", apply_chat_template=chat, metadata={"split": "heldout"},
                        knowledge=cfg.knowledge, agree=cfg.agree, attention=cfg.attention)
    return run_sweep(sweep)


# --------------------------------------------------------------------------------------- the study

def base_model(cfg: StudyConfig) -> Path:
    if cfg.model:
        return Path(cfg.model).resolve()
    from ..default_model import default_model_path

    return default_model_path()


def run_study(cfg: StudyConfig, log=print) -> int:
    """Every part of the study; returns the number of failed checkpoints of the sweeps."""
    from ..checkpoints import folder_identity

    out = Path(cfg.output_path)
    base = base_model(cfg)
    claim_study_folder(out, {"design": "known_lora", "model_id": folder_identity(base), **settings_of(cfg)})
    start = time.perf_counter()
    manifest = prepare_data(cfg, base, log)
    add_time(out, "data", time.perf_counter() - start)
    log(f"data: pools {manifest['pool']}, kept {manifest['kept']}")
    probe = read_jsonl(out / "data" / "loss_probe.jsonl")
    from transformers import AutoTokenizer

    chat = has_chat_template(AutoTokenizer.from_pretrained(base))
    failed = 0
    for arm_name, seed in runs(cfg):
        arm = ARMS[arm_name]
        run_dir = out / "runs" / run_name(arm_name, seed)
        try:
            if not (run_dir / "run.json").is_file():
                start = time.perf_counter()
                points = arm_points(cfg, arm, base, log)
                log(f"train {run_dir.name}: {kind_counts(points)}")
                train_run(cfg, arm, seed, points, probe, base, run_dir, log)
                add_time(out, f"train/{run_dir.name}", time.perf_counter() - start)
            start = time.perf_counter()
            log(f"sweep {run_dir.name}")
            failed += sweep_run(cfg, run_dir, chat)
            add_time(out, f"sweep/{run_dir.name}", time.perf_counter() - start)
        except (StudyError, RuntimeError, OSError, ValueError) as err:  # one run's failure; the next runs go on
            log(f"cf-tasks: error: {run_dir.name}: {err}", file=sys.stderr)
            failed += 1
        build_report(cfg, log=lambda *a, **k: None)  # what finished so far, in the report
    build_report(cfg, log)
    return failed
