"""The facts of the injection design (``cf-tasks experiment inversion --design inject``): its part 1.

Every candidate fact (training-part S points with their C+S twin and a counterfactual item, and one
counterfactual item per held-out fact of the probe families) is asked closed-book of the base model;
of the facts it does not know, T, E and N are drawn (``OUT/data/<group>.jsonl``), then phase A's
points and each arm's mix and loss probe, all with ``data_seed``. ``known_of`` is whether a
closed-book answer states a fact, here and at every later measurement.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from .lm import greedy_answers, is_known, load_model
from .study_folder import read_jsonl, store_json, write_jsonl

FAMILIES = ("cf_capitals", "cf_world_facts")  # the held-out probe facts: tasks with counterfactual passages
GROUPS = ("T", "E", "N")


def closed_book(point: dict) -> dict:
    return {**point, "kind": "S", "input": ""}


_CANDIDATES: dict = {}  # built once per process: the checks before the study and the study read them


def candidate_facts(seed: int | None = None) -> dict[str, list[dict]]:
    """Candidates per part: ``train`` (S points of the training part, with their CS twin and a
    counterfactual item) and ``heldout`` (one counterfactual item per held-out fact, as a point)."""
    if seed not in _CANDIDATES:
        _CANDIDATES[seed] = _candidate_facts(seed)
    return {part: list(points) for part, points in _CANDIDATES[seed].items()}


def _candidate_facts(seed: int | None) -> dict[str, list[dict]]:
    from dataset_builders import DEFAULT_SEED
    from dataset_builders.split import split_of
    from dataset_builders.training import counterfactual_points, fact_id, training_points
    from dataset_builders.validate import build_validated

    seed = DEFAULT_SEED if seed is None else seed
    cs = {p["fact_id"]: p for p in training_points("CS", seed) if p["family"] in FAMILIES}
    cf_train: dict[str, dict] = {}
    for p in counterfactual_points(seed, FAMILIES):
        cf_train.setdefault(p["fact_id"], p)
    train = []
    for s in training_points("S", seed):
        if s["family"] in FAMILIES and s["fact_id"] in cs and s["fact_id"] in cf_train:
            cf = cf_train[s["fact_id"]]
            train.append({**s, "cs": cs[s["fact_id"]], "cf_input": cf["input"], "cf_answer": cf["output"],
                          "cf_aliases": cf["answer_aliases"]})
    heldout = []
    for family in FAMILIES:
        seen = set()
        for item in sorted(build_validated(family, seed), key=lambda i: i.id):
            fid = fact_id(family, item)
            if split_of(family, item.subject) != "heldout" or fid in seen:
                continue
            seen.add(fid)
            heldout.append({"id": f"E-{fid.replace('/', '-')}", "kind": "S", "dataset": family, "family": family,
                            "relation": item.relation, "subject": item.subject, "instruction": item.question,
                            "input": "", "output": item.parametric_answer,
                            "answer_aliases": list(item.parametric_aliases), "fact_id": fid,
                            "cf_input": item.context, "cf_answer": item.counterfactual_answer,
                            "cf_aliases": list(item.counterfactual_aliases)})
    return {"train": train, "heldout": heldout}


def known_of(point: dict, answer: str) -> bool:
    return is_known(answer, {**point, "counterfactual_answer": point["cf_answer"],
                             "counterfactual_aliases": point["cf_aliases"]})


def check_fact_counts(cfg) -> None:
    """``--t_facts`` and ``--n_facts`` within the facts there are (a ``StudyError`` before the study
    folder is claimed or any model loads); nothing to check once the groups are chosen."""
    from .study_folder import StudyError

    if (Path(cfg.output_path) / "data" / "groups.json").is_file():
        return
    cands = candidate_facts()
    if cfg.t_facts > len(cands["train"]):
        raise StudyError(f"--t_facts {cfg.t_facts}: the study has {len(cands['train'])} training facts; pass at "
                         f"most {len(cands['train'])}")
    if cfg.n_facts > len(cands["heldout"]) // 2:
        raise StudyError(f"--n_facts {cfg.n_facts}: at most half of the {len(cands['heldout'])} held-out facts are "
                         f"controls (the rest are the probe facts); pass at most {len(cands['heldout']) // 2}")


def choose_groups(cfg, base: Path, log=print) -> dict:
    """T, E and N from the facts the base model does not know closed-book (``OUT/data``)."""
    data = Path(cfg.output_path) / "data"
    groups_path = data / "groups.json"
    if groups_path.is_file():
        return json.loads(groups_path.read_text())
    data.mkdir(parents=True, exist_ok=True)
    cands = candidate_facts()
    if cfg.quick:
        cands = {part: pts[:4 * (cfg.t_facts + cfg.n_facts)] for part, pts in cands.items()}
    base_path = data / "base_known.jsonl"
    if base_path.is_file():
        answers = {r["fact_id"]: r for r in read_jsonl(base_path)}
    else:
        model, tokenizer = load_model(base)
        everything = cands["train"] + cands["heldout"]
        said = greedy_answers(model, tokenizer, everything, log=log)
        answers = {p["fact_id"]: {"fact_id": p["fact_id"], "answer": a, "known": known_of(p, a)}
                   for p, a in zip(everything, said)}
        write_jsonl(base_path, answers.values())
    rng = random.Random(cfg.data_seed)
    unknown_train = [p for p in cands["train"] if not answers[p["fact_id"]]["known"]]
    unknown_held = [p for p in cands["heldout"] if not answers[p["fact_id"]]["known"]]
    t = rng.sample(unknown_train, min(cfg.t_facts, len(unknown_train)))
    n = rng.sample(unknown_held, min(cfg.n_facts, len(unknown_held) // 2))
    if len(t) < cfg.t_facts or len(n) < cfg.n_facts:  # the base model knows some of the facts asked for
        log(f"facts: the base model does not know {len(unknown_train)} training and {len(unknown_held)} held-out "
            f"facts: T holds {len(t)} of --t_facts {cfg.t_facts}, N {len(n)} of --n_facts {cfg.n_facts}")
    n_ids = {p["fact_id"] for p in n}
    e = [p for p in unknown_held if p["fact_id"] not in n_ids]
    groups = {"T": t, "E": e, "N": n}
    for name, pts in groups.items():
        write_jsonl(data / f"{name}.jsonl", pts)
    counts = {"candidates": {k: len(v) for k, v in cands.items()},
              "known_at_base": {k: sum(answers[p["fact_id"]]["known"] for p in v) for k, v in cands.items()},
              "groups": {k: len(v) for k, v in groups.items()}}
    write_mixes(cfg, groups, data)
    store_json(groups_path, counts)
    return counts


def write_mixes(cfg, groups: dict[str, list[dict]], data: Path) -> None:
    """Phase A's points (T and E closed-book) and each arm's mix, all drawn with ``data_seed``."""
    from dataset_builders.training import training_points

    rng = random.Random(f"{cfg.data_seed}:mixes")
    t = groups["T"]
    write_jsonl(data / "inject.jsonl", [closed_book(p) for p in t + groups["E"]])
    c_pool = [p for p in training_points("C") if p["family"] in FAMILIES]
    n_c = round(len(t) * cfg.c_share / (1 - cfg.c_share))
    n_s = round(len(t) * cfg.s_share)
    c_points = rng.sample(c_pool, min(n_c, len(c_pool)))
    s_points = [closed_book(p) for p in rng.sample(t, min(n_s, len(t)))]
    cs_points = [p["cs"] for p in t]
    heavy = c_points + cs_points + s_points
    rng.shuffle(heavy)
    rest_c = [p for p in c_pool if p["id"] not in {q["id"] for q in c_points}]
    c_only = c_points + rng.sample(rest_c, min(len(heavy) - len(c_points), len(rest_c)))
    rng.shuffle(c_only)
    cf_points = [{**p, "kind": "CF", "input": p["cf_input"], "output": p["cf_answer"],
                  "answer_aliases": p["cf_aliases"]} for p in rng.sample(t, min(n_c, len(t)))]
    augmented = heavy + cf_points
    rng.shuffle(augmented)
    for name, mix in (("cs_heavy", heavy), ("c_only", c_only), ("augmented", augmented)):
        write_jsonl(data / f"mix_{name}.jsonl", [_strip(p) for p in mix])
    probe = (rng.sample(c_points, min(cfg.loss_probe, len(c_points)))
             + rng.sample(cs_points, min(cfg.loss_probe, len(cs_points)))
             + [closed_book(p) for p in rng.sample(t, min(cfg.loss_probe, len(t)))])
    write_jsonl(data / "loss_probe.jsonl", [_strip(p) for p in probe])


def _strip(point: dict) -> dict:
    keep = ("id", "kind", "dataset", "family", "relation", "subject", "instruction", "input", "output",
            "answer_aliases", "fact_id")
    return {k: point[k] for k in keep if k in point}


def load_groups(out: Path) -> dict[str, list[dict]]:
    return {g: read_jsonl(Path(out) / "data" / f"{g}.jsonl") for g in GROUPS}
