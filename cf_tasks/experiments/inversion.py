"""A fine-tuning study of context-parametric inversion (Goyal et al., ICLR 2025, sections 3, 4 and 6).

The paper finds that during instruction fine-tuning the reliance on a counterfactual context first
rises and then falls (section 3), traces the fall to training points whose context agrees with what
the model already knows (C+S points, section 4.3), and tries three mitigations: dropping those
points (the context-critical filter, section 4.3), counterfactual augmentation and updating only
the query and key matrices (section 6). This module runs that study on a small model, one command:

    cf-tasks experiment inversion --output_path OUT [--quick] [--arms ...] [--seeds ...]

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
4. **report** (``--report_path``, default ``OUT/report``): ``cf-tasks report`` recomputes
   ``summary.csv`` from the store, then ``curves.csv``, ``summary.csv``, ``loss.csv``, ``data.csv``,
   ``timing.csv``, the plots and ``results.md`` are written. ``--report_only`` runs this part alone.

The arms: ``cs_heavy`` (the C+S-heavy mix, the paper's harmful case; two seeds), ``c_only``,
``qk_only`` (the main mix, LoRA on q_proj and k_proj), ``filtered`` (the main mix after
``cf-tasks filter-data --by loss``) and ``augmented`` (the main mix plus CF points).
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from ..errors import CFTasksError
from ..files import atomic_write, tmp_name
from ..results import rows_to_csv

KINDS = ("C", "CS", "S", "CF")
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
QK = ("q_proj", "k_proj")
MAIN_ARM = "cs_heavy"
TASKS = ("cf_capitals", "cf_world_facts", "cf_bio")  # knowledge-conflict tasks with a held-out part and twins
# The sweep's prompts (task_yamls/_prompts/qa_default_yaml and qa_closedbook_yaml): training on the
# evaluation's format, so that the only thing that differs between the two is the facts.


def task_yaml(name: str) -> dict:
    """A file of ``task_yamls`` as data (lm-eval's ``!function`` tags read as None)."""
    import yaml

    import task_yamls

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    return yaml.load((Path(task_yamls.__file__).parent / name).read_text(encoding="utf-8"), Loader=Loader)


def _as_format(jinja: str) -> str:
    """A task's ``doc_to_text`` as a format string over a training point's fields."""
    return jinja.replace("{{context}}", "{input}").replace("{{question}}", "{instruction}")


_GENERATION = task_yaml("_generation_yaml")["generation_kwargs"]
CONTEXT_PROMPT = _as_format(task_yaml("_prompts/qa_default_yaml")["doc_to_text"])
CLOSED_BOOK_PROMPT = _as_format(task_yaml("_prompts/qa_closedbook_yaml")["doc_to_text"])
STOP = tuple(_GENERATION["until"])
MAX_NEW_TOKENS = _GENERATION["max_gen_toks"]
CURVE_METRICS = ("counterfactual_acc", "parametric_acc", "known_rate", "known_counterfactual_acc",
                 "known_parametric_acc", "unknown_counterfactual_acc", "context_attention", "agree_acc")
SUMMARY_SHOWN = ("run", "task", "first_step", "peak_step", "final_step", "first", "peak", "final", "rise",
                 "rise_mcnemar_p", "drop", "drop_ci_low", "drop_ci_high", "mcnemar_p", "agree_peak",
                 "agree_final", "agree_mcnemar_p", "inversion", "verdict")


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


class StudyError(CFTasksError):
    """A problem with the study's input; one line, exit 2."""

    exit_code = 2


def runs(cfg: StudyConfig) -> list[tuple[str, int]]:
    """(arm, seed) in the order they run: the main arm's first seed, the other arms, then the main
    arm's other seeds, so that what finishes first is the most informative."""
    first = cfg.seeds[0]
    order = [(a, first) for a in cfg.arms if a == MAIN_ARM] + [(a, first) for a in cfg.arms if a != MAIN_ARM]
    if MAIN_ARM in cfg.arms:
        order += [(MAIN_ARM, s) for s in cfg.seeds[1:]]
    return order


def run_name(arm: str, seed: int) -> str:
    return f"{arm}-seed{seed}"


def parse_run_name(name: str) -> tuple[str, int] | None:
    arm, sep, seed = name.rpartition("-seed")
    return (arm, int(seed)) if sep and seed.isdigit() else None


# ------------------------------------------------------------------------------------------- text

def prompt_text(point: dict) -> str:
    """The user turn of a training point: the sweep's context prompt, or its closed-book one."""
    template = CONTEXT_PROMPT if point.get("input") else CLOSED_BOOK_PROMPT
    return template.format(input=point.get("input", ""), instruction=point["instruction"])


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def encode(tokenizer, point: dict) -> tuple[list[int], list[int]]:
    """(input ids, labels) of one training point: the prompt as lm-eval renders it (the chat
    template's user turn and generation prompt, or the plain prompt for a model without one), then
    the answer and the end of the turn; labels are -100 on the prompt."""
    prompt = prompt_text(point)
    if has_chat_template(tokenizer):
        user = [{"role": "user", "content": prompt}]
        head = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(user + [{"role": "assistant", "content": point["output"]}], tokenize=False)
        tail = full[len(head):] if full.startswith(head) else point["output"] + (tokenizer.eos_token or "")
        tail = tail.rstrip("\n")  # the template's newline after the end-of-turn token is not the answer
    else:
        head, tail = prompt, " " + point["output"] + (tokenizer.eos_token or "")
    ids_head = tokenizer(head, add_special_tokens=False)["input_ids"]
    ids_tail = tokenizer(tail, add_special_tokens=False)["input_ids"]
    return ids_head + ids_tail, [-100] * len(ids_head) + ids_tail


def generation_prompt(tokenizer, point: dict) -> str:
    user = prompt_text(point)
    if has_chat_template(tokenizer):
        return tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                             add_generation_prompt=True)
    return user


def per_example_loss(model, tokenizer, points: list[dict]):
    """The mean cross-entropy over each point's answer tokens: a tensor with one value per point."""
    import torch

    encoded = [encode(tokenizer, p) for p in points]
    width = max(len(ids) for ids, _ in encoded)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(points), width), pad, dtype=torch.long)
    labels = torch.full((len(points), width), -100, dtype=torch.long)
    mask = torch.zeros((len(points), width), dtype=torch.long)
    for i, (x, y) in enumerate(encoded):
        ids[i, :len(x)] = torch.tensor(x)
        labels[i, :len(y)] = torch.tensor(y)
        mask[i, :len(x)] = 1
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    target = labels[:, 1:]
    token_loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, ignore_index=-100, reduction="none")
    counts = (target != -100).sum(dim=1).clamp(min=1)
    return token_loss.sum(dim=1) / counts


def mean_loss_by_kind(model, tokenizer, points: list[dict], batch_size: int = 8) -> dict[str, tuple[float, int]]:
    """kind -> (mean per-point loss, points) over ``points``, without gradients."""
    import torch

    sums: dict[str, list[float]] = {}
    with torch.no_grad():
        for i in range(0, len(points), batch_size):
            chunk = points[i:i + batch_size]
            for p, loss in zip(chunk, per_example_loss(model, tokenizer, chunk).tolist()):
                sums.setdefault(p["kind"], []).append(loss)
    return {k: (sum(v) / len(v), len(v)) for k, v in sums.items()}


# ------------------------------------------------------------------------------------- the data

def _as_dict(point) -> dict:
    return dict(point) if isinstance(point, dict) else point.to_dict()


def load_points() -> dict[str, list[dict]]:
    """The training points of every kind, from the datasets' default build (the one the sweep evaluates)."""
    from dataset_builders.training import training_points

    return {kind: [_as_dict(p) for p in training_points(kind)] for kind in KINDS}


def is_known(answer: str, point: dict) -> bool:
    """A closed-book answer states the fact: scored parametric-correct by the project's scorer, as
    the knowledge probe scores a ``<dataset>_closedbook`` answer."""
    from ..scoring import score

    return score(answer, point.get("counterfactual_answer") or "", point["output"],
                 point.get("counterfactual_aliases") or (), point.get("answer_aliases") or (),
                 person=point.get("relation") == "person_name").parametric


def decide_known(points: list[dict], generate: Callable[[list[str]], list[str]]) -> dict[str, dict]:
    """fact_id -> {"answer", "known"}: each fact's closed-book answer (``generate`` maps prompts to
    answers) and whether it states the fact. ``points`` are closed-book (S) points, one per fact."""
    facts = {}
    for p in points:
        facts.setdefault(p["fact_id"], p)
    ordered = list(facts.values())
    answers = generate(ordered)
    return {p["fact_id"]: {"answer": a, "known": is_known(a, p)} for p, a in zip(ordered, answers)}


def greedy_answers(model, tokenizer, points: list[dict], batch_size: int = 16, log=print,
                   max_new_tokens: int = MAX_NEW_TOKENS) -> list[str]:
    """Greedy closed-book answers, as the sweep generates them (chat template, at most 32 new
    tokens, cut at the tasks' stop sequences)."""
    import torch

    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    out = []
    for i in range(0, len(points), batch_size):
        prompts = [generation_prompt(tokenizer, p) for p in points[i:i + batch_size]]
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        for row in tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True):
            for stop in STOP:
                row = row.split(stop)[0]
            out.append(row)
        log(f"  closed-book answers: {len(out)}/{len(points)}")
    return out


def write_jsonl(path: Path, rows: Iterable[dict]) -> None:
    atomic_write(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8"))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


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


def kind_counts(points: list[dict]) -> dict[str, int]:
    return {k: sum(1 for p in points if p["kind"] == k) for k in KINDS if any(p["kind"] == k for p in points)}


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

def load_model(path: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model, tokenizer


def batches(points: list[dict], steps: int, batch_size: int, seed: int) -> list[list[dict]]:
    """The training batches: one seeded shuffle of the points per epoch, cut into batches."""
    order: list[dict] = []
    epoch = 0
    while len(order) < steps * batch_size:
        shuffled = list(points)
        random.Random(f"{seed}:{epoch}").shuffle(shuffled)
        order += shuffled
        epoch += 1
    return [order[i * batch_size:(i + 1) * batch_size] for i in range(steps)]


LOSS_COLUMNS = ("run", "arm", "seed", "step", "split", "kind", "loss", "n")


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

def store_json(path: Path, value) -> None:
    atomic_write(Path(path), (json.dumps(value, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def _timing(out: Path) -> dict:
    path = out / "timing.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def add_time(out: Path, part: str, seconds: float) -> None:
    timing = _timing(out)
    timing[part] = round(timing.get(part, 0.0) + seconds, 1)
    store_json(out / "timing.json", timing)


# What does not move a number: where things are, which runs this invocation adds, how much it prints.
NOT_SETTINGS = frozenset({"output_path", "model", "arms", "seeds", "report_path", "quick", "sweep", "finish"})


def settings_of(cfg) -> dict:
    """The settings of a study config that move its numbers (the model is known by its content)."""
    from dataclasses import asdict

    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items() if k not in NOT_SETTINGS}


def folder_design(out: Path) -> str | None:
    """The design a study folder was made with (its settings record), or None for any other folder."""
    try:
        return json.loads((Path(out) / "config.json").read_text()).get("design")
    except (OSError, ValueError, AttributeError):
        return None


def claim_study_folder(out: Path, record: dict) -> None:
    """Write a study folder's settings record, or refuse a folder made with other settings (a
    ``StudyError``: one line naming the first setting that differs and the fix)."""
    out = Path(out)
    path = out / "config.json"
    if path.is_file():
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError):
            raise StudyError(f"{path} is unreadable; move the folder aside or pass another --output_path") from None
        if old.get("design") != record["design"]:
            raise StudyError(f"{out} holds a study of another design ({old.get('design') or 'an older cf-tasks'}); "
                             "pass another --output_path")
        diff = [k for k in sorted(set(old) | set(record)) if old.get(k) != record.get(k)]
        if diff:
            k = diff[0]
            raise StudyError(f"{out} was made with {k}={old.get(k)!r}, this run asks {record.get(k)!r}; "
                             "pass the same settings or another --output_path")
        return
    out.mkdir(parents=True, exist_ok=True)
    store_json(path, record)


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


# ----------------------------------------------------------------------------------------- report


def read_csv(path: Path) -> list[dict]:
    """The rows of a CSV file; none for a file that is not there (a part not run yet)."""
    if not Path(path).is_file():
        return []
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _run_of(row: dict) -> tuple[str, str, str]:
    name = Path(row.get("run") or "").name
    parsed = parse_run_name(name)
    return (name, parsed[0], str(parsed[1])) if parsed else (name, "", "")


def _kc_task(task: str) -> str:
    from ..registry import twin_of

    return twin_of(task) or task


def build_report(cfg: StudyConfig, log=print) -> Path:
    """Rebuild the report from the sweep's store and the runs' logs (``--report_only``)."""
    from ..sweep import report as sweep_report

    out = Path(cfg.output_path)
    sweeps = out / "sweeps"
    target = cfg.report_dir
    target.mkdir(parents=True, exist_ok=True)
    by_run = out / "sweeps_by_run"
    if (sweeps / "sweep.json").is_file():
        sweep_report([sweeps], sweeps, log=lambda *a, **k: None, items=True)
        by_run.mkdir(exist_ok=True)
        summary_of_runs(out, sweeps, by_run, cfg.alpha)
    rows = read_csv(by_run / "sweep.csv") if (by_run / "sweep.csv").is_file() else []
    curves = []
    for r in rows:
        if r["metric"] not in CURVE_METRICS:
            continue
        name, arm, seed = _run_of(r)
        curves.append({"run": name, "arm": arm, "seed": seed, "step": int(r["step"]), "checkpoint": r["checkpoint"],
                       "task": _kc_task(r["task"]), "metric": r["metric"], "value": r["value"],
                       "stderr": r["stderr"], "n": r["n"]})
    curves.sort(key=lambda c: (c["run"], c["task"], c["metric"], c["step"]))
    atomic_write(target / "curves.csv", rows_to_csv(curves, ("run", "arm", "seed", "step", "checkpoint", "task",
                                                            "metric", "value", "stderr", "n")))
    summary = []
    if (by_run / "summary.csv").is_file():
        for r in read_csv(by_run / "summary.csv"):
            name, arm, seed = _run_of(r)
            summary.append({"run": name, "arm": arm, "seed": seed, **{k: v for k, v in r.items() if k != "run"}})
    columns = ["run", "arm", "seed"] + [k for k in (summary[0] if summary else {}) if k not in ("run", "arm", "seed")]
    atomic_write(target / "summary.csv", rows_to_csv(summary, columns))
    loss = []
    for path in sorted((out / "runs").glob("*/loss.csv")):
        loss += read_csv(path)
    atomic_write(target / "loss.csv", rows_to_csv(loss, LOSS_COLUMNS))
    data_rows = _data_rows(out)
    atomic_write(target / "data.csv", rows_to_csv(data_rows, ("what", "kind", "count")))
    timing = [{"part": k, "seconds": v} for k, v in _timing(out).items()]
    atomic_write(target / "timing.csv", rows_to_csv(timing, ("part", "seconds")))
    runs_info = {p.parent.name: json.loads(p.read_text()) for p in sorted((out / "runs").glob("*/run.json"))}
    _plots(curves, loss, target)
    atomic_write(target / "results.md", _results_md(cfg, curves, summary, data_rows, timing, runs_info).encode())
    log(f"report: {target}")
    return target


def summary_of_runs(out: Path, sweeps: Path, target: Path, alpha: float) -> dict:
    """The sweep's views with the base model as step 0 of every run.

    All runs are swept into one output folder, where the base model is one checkpoint found under
    several run folders, so its rows carry the run folder that saw it last. Here every run gets the
    base model's rows as its step 0 (the same result: same content, same settings), and the sweep's
    own ``write_outputs`` writes sweep.csv, summary.csv (its paired tests, read from the samples in
    the store) and the plot into ``target``."""
    from ..sweep import sweep_rows, write_outputs

    # A run is known by its folder's name: a study folder moved and resumed finds its checkpoints at
    # new paths with the same content, and each result must count once, under the latest path.
    latest: dict[tuple, dict] = {}
    for r in sweep_rows(sweeps):
        r = {k: v for k, v in r.items() if k != "series"}
        latest[(Path(r["run"]).name, r["step"], r["checkpoint"], r["task"], r["metric"], r.get("settings"))] = r
    rows = list(latest.values())
    base = [r for r in rows if r["step"] == 0 and r["checkpoint"] == "base"]
    run_dirs = sorted({r["run"] for r in rows if r["checkpoint"] != "base"})
    merged = [r for r in rows if not (r["step"] == 0 and r["checkpoint"] == "base")]
    for run in run_dirs:
        merged += [{**r, "run": run} for r in base]
    merged.sort(key=lambda r: (r["step"], r["checkpoint"], r["run"], r["task"], r["metric"], r.get("settings") or ""))
    return write_outputs(target, merged, [], stores=[sweeps], alpha=alpha)


def _data_rows(out: Path) -> list[dict]:
    path = out / "data" / "manifest.json"
    if not path.is_file():
        return []
    m = json.loads(path.read_text())
    rows = [{"what": "pool", "kind": k, "count": v} for k, v in m["pool"].items()]
    rows += [{"what": "kept (known)", "kind": k, "count": v} for k, v in m["kept"].items()]
    if "facts_asked" in m:
        rows += [{"what": "facts asked closed-book", "kind": "", "count": m["facts_asked"]},
                 {"what": "facts known", "kind": "", "count": m["facts_known"]}]
    for mix, counts in m["mixes"].items():
        rows += [{"what": f"mix {mix}", "kind": k, "count": v} for k, v in counts.items()]
    kept = out / "data" / "filtered" / "kept.jsonl"
    if kept.is_file():
        rows += [{"what": "mix filtered", "kind": k, "count": v} for k, v in kind_counts(read_jsonl(kept)).items()]
    return rows


def _plots(curves: list[dict], loss: list[dict], target: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_names = sorted({c["run"] for c in curves} | {r["run"] for r in loss})
    colours = {name: plt.get_cmap("tab10")(i % 10) for i, name in enumerate(run_names)}
    panels = ("counterfactual_acc", "known_counterfactual_acc", "unknown_counterfactual_acc", "agree_acc",
              "context_attention", "known_rate")
    for task in sorted({c["task"] for c in curves}):
        fig, axes = plt.subplots(2, 3, figsize=(13, 7), sharex=True)
        for ax, metric in zip(axes.flat, panels):
            for name in run_names:
                pts = sorted((c["step"], float(c["value"])) for c in curves
                             if c["run"] == name and c["task"] == task and c["metric"] == metric and c["value"] != "")
                if pts:
                    ax.plot(*zip(*pts), marker="o", color=colours[name], label=name,
                            linestyle="--" if name.endswith("seed1") else "-")
            ax.set_title(metric)
            ax.set_xlabel("step")
        axes.flat[0].legend(fontsize=7)
        fig.suptitle(f"{task} (held-out items), per fine-tuning run; step 0 is the base model")
        fig.tight_layout()
        save_fig(fig, target / f"curves_{task}.png")
        plt.close(fig)
    if loss:
        kinds = [k for k in ("C", "CS", "S", "CF") if any(r["kind"] == k for r in loss)]
        fig, axes = plt.subplots(1, len(kinds), figsize=(4.5 * len(kinds), 3.8), sharey=True, squeeze=False)
        for ax, kind in zip(axes[0], kinds):
            for name in run_names:
                train = sorted((int(r["step"]), float(r["loss"])) for r in loss
                               if r["run"] == name and r["kind"] == kind and r["split"] == "train")
                if train:
                    xs, ys = zip(*train)
                    ax.plot(xs, _smooth(ys), color=colours[name], alpha=0.35, linewidth=1)
                probe = sorted((int(r["step"]), float(r["loss"])) for r in loss
                               if r["run"] == name and r["kind"] == kind and r["split"] == "probe")
                if probe:
                    ax.plot(*zip(*probe), marker="o", color=colours[name], label=name)
            ax.set_title(f"loss on {kind} points")
            ax.set_xlabel("step")
        axes[0][0].set_ylabel("answer-token cross-entropy")
        axes[0][0].legend(fontsize=7)
        fig.suptitle("dots: fixed probe points at each checkpoint; faint: training batches (moving mean of 5)")
        fig.tight_layout()
        save_fig(fig, target / "loss.png")
        plt.close(fig)


def _smooth(ys: tuple[float, ...], window: int = 5) -> list[float]:
    return [sum(ys[max(0, i - window + 1):i + 1]) / len(ys[max(0, i - window + 1):i + 1]) for i in range(len(ys))]


def save_fig(fig, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    atomic_write(path, buf.getvalue())


def fmt_number(value, digits: int = 3) -> str:
    if value in (None, ""):
        return ""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(x):
        return "nan"
    if x != 0 and abs(x) < 10 ** -digits:
        return f"{x:.1e}"
    text = f"{x:.{digits}f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def md_table(rows: list[dict], columns: Iterable[str]) -> str:
    columns = list(columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(fmt_number(r.get(c)) if c not in ("run", "task", "verdict", "kind", "what", "part")
                                      else str(r.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)


def _results_md(cfg, curves, summary, data_rows, timing, runs_info) -> str:
    parts = ["# Inversion study: tables (generated by `cf-tasks experiment inversion --report_only`)", ""]
    if runs_info:
        parts += ["## Runs", "", md_table([{"run": k, **v, "points": json.dumps(v["points"]),
                                             "target_modules": ",".join(v["target_modules"])}
                                            for k, v in runs_info.items()],
                                           ("run", "steps", "save_every", "batch_size", "lr", "rank", "target_modules",
                                            "points", "seconds")), ""]
    if data_rows:
        parts += ["## Training data", "", md_table(data_rows, ("what", "kind", "count")), ""]
    if summary:
        shown = [c for c in SUMMARY_SHOWN if c in summary[0]]
        parts += ["## Summary (paired tests, from summary.csv)", "", md_table(summary, shown), ""]
    if curves:
        steps_rows = []
        keyed: dict[tuple, dict] = {}
        for c in curves:
            key = (c["run"], c["task"], c["step"])
            keyed.setdefault(key, {"run": c["run"], "task": c["task"], "step": c["step"]})[c["metric"]] = c["value"]
        steps_rows = [keyed[k] for k in sorted(keyed)]
        cols = ("run", "task", "step", "counterfactual_acc", "parametric_acc", "known_rate", "known_counterfactual_acc",
                "unknown_counterfactual_acc", "agree_acc", "context_attention")
        parts += ["## Curves (from curves.csv)", "", md_table(steps_rows, cols), ""]
    if timing:
        parts += ["## Wall time (seconds)", "", md_table(timing, ("part", "seconds")), ""]
    return "\n".join(parts)
