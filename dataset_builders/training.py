"""Training points for fine-tuning studies, made from the training part of the subject split.

The context-parametric inversion (Goyal et al., sections 3-4) is traced by training on points of
known kinds and evaluating on subjects never trained on (``split.py``). Four kinds, each a list of
dicts with the same fields (``id``, ``kind``, ``dataset``, ``family``, ``relation``, ``subject``,
``instruction`` (the question), ``input`` (the context; "" closed-book), ``output`` (the target),
``answer_aliases``, ``fact_id``):

- ``C``: invented entities whose passage states their facts: only the context answers
  (``invented.py``, with its own rules);
- ``CS``: a real fact of the training part whose passage states the true answer (the agreeing twins
  ``<dataset>_agree``), one point per fact;
- ``S``: the same facts closed-book (question only, true answer); a CS point and its S point share
  their ``fact_id``, so a knowledge probe can keep or drop both;
- ``CF``: the counterfactual items of the training part (the datasets' own items, the target is
  the counterfactual answer): the counterfactual augmentation.

No point names a held-out subject anywhere in its text: a point that would is left out, and
``disjointness_failures`` proves it on any list of points (``check_training``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from . import AGREE_TWINS, DEFAULT_SEED
from .common import slug
from .invented import invented_points
from .invented import failures as invented_failures
from .invented import rule_failures
from .schema import Item
from .split import SPLIT_SEED, canonical_name, mentions_heldout, part_of_key, split_of, subject_key

KINDS = ("C", "CS", "S", "CF")
FAMILIES = ("cf_capitals", "cf_world_facts", "cf_bio")  # the families training points are made from
FIELDS = ("id", "kind", "dataset", "family", "relation", "subject", "instruction", "input", "output",
          "answer_aliases", "fact_id")


class TrainingDataError(ValueError):
    """Training points broke a rule; ``str()`` has one line per rule."""


def fact_id(family: str, item: Item) -> str:
    """The fact an item asks about: family, relation and subject ("cf_capitals/country_capital/france")."""
    return f"{family}/{item.relation}/{slug(canonical_name(family, item.subject))}"


def _point(kind: str, family: str, item: Item, context: str, answer: str, aliases: list[str]) -> dict:
    return {
        "id": f"{kind}-{item.id}",
        "kind": kind,
        "dataset": item.dataset,
        "family": family,
        "relation": item.relation,
        "subject": canonical_name(family, item.subject),
        "instruction": item.question,
        "input": context,
        "output": answer,
        "answer_aliases": list(aliases),
        "fact_id": fact_id(family, item),
    }


def point_text(point: dict) -> str:
    """Everything a model trained on ``point`` reads: question, context, target and its aliases."""
    return " \n ".join([point["instruction"], point["input"], point["output"], *point.get("answer_aliases", [])])


@lru_cache(maxsize=16)
def _train_items(dataset: str, family: str, seed: int) -> tuple[Item, ...]:
    """The validated items of ``dataset`` whose subject is in the training part."""
    from .validate import build_validated

    return tuple(i for i in build_validated(dataset, seed) if split_of(family, i.subject) == "train")


def _kept(points: list[dict]) -> list[dict]:
    return [p for p in points if not mentions_heldout(point_text(p))]


def counterfactual_points(seed: int = DEFAULT_SEED, families: tuple[str, ...] = FAMILIES) -> list[dict]:
    """CF: the training part's counterfactual items, target = the counterfactual answer."""
    points = []
    for family in families:
        points += [_point("CF", family, i, i.context, i.counterfactual_answer, i.counterfactual_aliases)
                   for i in _train_items(family, family, seed)]
    return _kept(points)


def _known_fact_pairs(seed: int, families: tuple[str, ...]) -> list[tuple[dict, dict]]:
    """(CS, S) per fact of the training part: the first agreeing twin of each fact whose passage and
    closed-book form both name no held-out subject."""
    pairs: list[tuple[dict, dict]] = []
    for family in families:
        seen: set[str] = set()
        for item in _train_items(AGREE_TWINS[family], family, seed):
            fid = fact_id(family, item)
            if fid in seen:
                continue
            cs = _point("CS", family, item, item.context, item.parametric_answer, item.parametric_aliases)
            s = {**_point("S", family, item, "", item.parametric_answer, item.parametric_aliases),
                 "dataset": family, "id": f"S-{fid.replace('/', '-')}"}
            cs["id"] = f"CS-{fid.replace('/', '-')}"
            if _kept([cs, s]) == [cs, s]:
                seen.add(fid)
                pairs.append((cs, s))
    return pairs


def training_points(kind: str, seed: int = DEFAULT_SEED) -> list[dict]:
    """The training points of one ``kind`` (``C``, ``CS``, ``S`` or ``CF``) for builder ``seed``."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; choose from {', '.join(KINDS)}")
    if kind == "C":
        return invented_points(seed)
    if kind == "CF":
        return counterfactual_points(seed)
    pairs = _known_fact_pairs(seed, FAMILIES)
    return [cs if kind == "CS" else s for cs, s in pairs]


# --- the rules over any training export ------------------------------------------------------------

def _heldout_subject(points: list[dict]) -> list[str]:
    return [p["id"] for p in points if p["kind"] != "C" and part_of_key(subject_key(p["subject"])) != "train"]


def _names_heldout(points: list[dict]) -> list[str]:
    return [f"{p['id']} ({', '.join(found)})" for p in points if (found := mentions_heldout(point_text(p)))]


def _fields(points: list[dict]) -> list[str]:
    return [str(p.get("id")) for p in points
            if any(f not in p for f in FIELDS) or p["kind"] not in KINDS or not p["output"] or not p["instruction"]
            or (p["kind"] == "S") != (p["input"] == "")]


def _unique_ids(points: list[dict]) -> list[str]:
    seen, dup = set(), []
    for p in points:
        if p["id"] in seen:
            dup.append(p["id"])
        seen.add(p["id"])
    return dup


RULES: dict[str, tuple[str, Callable[[list[dict]], list[str]]]] = {
    "train_fields": ("every field present, a known kind, a question and a target; a context exactly "
                     "when the kind is not S", _fields),
    "train_unique_ids": ("ids are unique", _unique_ids),
    "heldout_subject": (f"no point is about a held-out subject (split seed {SPLIT_SEED})", _heldout_subject),
    "heldout_disjoint": ("no point's question, context, target or aliases names a held-out subject",
                         _names_heldout),
}


def disjointness_failures(points: list[dict]) -> list[str]:
    """One line per broken rule of ``RULES`` (and, for C points, of ``invented.RULES``)."""
    lines = rule_failures(RULES, points, separator="; ")
    invented = [p for p in points if p.get("kind") == "C"]
    return lines + (invented_failures(invented) if invented else [])


def check_training(points: list[dict]) -> None:
    lines = disjointness_failures(points)
    if lines:
        raise TrainingDataError("\n".join(lines))


# --- export: JSON Lines a trainer reads ------------------------------------------------------------

TRAINING_FORMATS = ("alpaca", "messages")
DEFAULT_KINDS = ("CF",)  # the counterfactual augmentation
META_FIELDS = ("id", "kind", "family", "relation", "subject", "fact_id", "answer_aliases")


def prompt_of(point: dict) -> str:
    """The user turn: the context, a blank line and the question; the question alone closed-book."""
    return f"{point['input']}\n\n{point['instruction']}" if point["input"] else point["instruction"]


def record(point: dict, fmt: str) -> dict:
    """One JSON Lines record: ``alpaca`` (instruction, input, output) or ``messages`` (a user and an
    assistant turn), each with the point's metadata (``META_FIELDS``) beside it."""
    meta = {k: point[k] for k in META_FIELDS}
    if fmt == "alpaca":
        return {"instruction": point["instruction"], "input": point["input"], "output": point["output"], **meta}
    if fmt == "messages":
        return {"messages": [{"role": "user", "content": prompt_of(point)},
                             {"role": "assistant", "content": point["output"]}], **meta}
    raise ValueError(f"unknown training format {fmt!r}; choose from {', '.join(TRAINING_FORMATS)}")


def parse_kinds(text: str) -> tuple[str, ...]:
    """"C,CS" -> ("C", "CS"); an unknown or repeated kind is a one-line ``ValueError``."""
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in KINDS]
    if not kinds or bad or len(set(kinds)) != len(kinds):
        what = f"unknown kind(s) {', '.join(bad)}" if bad else "no kind" if not kinds else "a kind named twice"
        raise ValueError(f"--kinds {text!r}: {what}; pass a comma-separated subset of {','.join(KINDS)}")
    return kinds


def manifest_settings(fmt: str, seed: int) -> dict:
    """What a training manifest records besides its kinds: the settings its points were made with."""
    from cf_tasks import __version__

    from . import version as dataset_version
    from .invented import MAX_ZIPF
    from .invented import VERSION as INVENTED_VERSION
    from .split import subjects

    return {"seed": seed, "split_seed": SPLIT_SEED, "format": fmt,
            "heldout_subjects": len(subjects("heldout")), "invented_max_zipf": MAX_ZIPF,
            "versions": {"cf_tasks": __version__, "invented": INVENTED_VERSION,
                         **{name: dataset_version(name) for f in FAMILIES for name in (f, AGREE_TWINS[f])}}}


def export(kinds: tuple[str, ...], fmt: str, seed: int, out_dir, keep: dict | None = None) -> dict:
    """Write ``<kind>.jsonl`` per kind and ``manifest.json`` to ``out_dir`` (atomically, after every
    rule holds over all the points together); returns the manifest. ``keep``: the entries of an
    earlier build of the same settings into ``out_dir`` (``serialize.prior_entries``), kept in the
    manifest beside this build's kinds."""
    import hashlib
    import json
    from collections import Counter
    from pathlib import Path

    from cf_tasks.files import atomic_write

    if fmt not in TRAINING_FORMATS:
        raise ValueError(f"unknown training format {fmt!r}; choose from {', '.join(TRAINING_FORMATS)}")
    by_kind = {kind: training_points(kind, seed) for kind in kinds}
    check_training([p for points in by_kind.values() for p in points])
    out = Path(out_dir)
    settings = manifest_settings(fmt, seed)
    # the settings, with the kinds (an earlier build's kept ones first) after the format, as before
    manifest = {k: settings[k] for k in ("seed", "split_seed", "format")} | {"kinds": dict(keep or {})} | settings
    for kind, points in by_kind.items():
        data = "".join(json.dumps(record(p, fmt), ensure_ascii=False) + "\n" for p in points).encode("utf-8")
        atomic_write(out / f"{kind}.jsonl", data)
        manifest["kinds"][kind] = {
            "file": f"{kind}.jsonl", "count": len(points),
            "families": dict(sorted(Counter(p["family"] for p in points).items())),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    atomic_write(out / "manifest.json", (json.dumps(manifest, indent=2) + "\n").encode("utf-8"))
    return manifest
