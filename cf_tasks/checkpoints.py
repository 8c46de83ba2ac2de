"""Finding and checking the checkpoints of a fine-tuning run folder.

A checkpoint is a sub-folder named ``checkpoint-N``, ``step_N``, ``step-N``, ``global_stepN`` or
``epoch_N``. It is a full checkpoint (``config.json`` plus weights) or a LoRA adapter
(``adapter_config.json`` plus adapter weights; its base model comes from the adapter config or
``--base``). Problems are recorded per checkpoint as one line that names the path and the fix, so
one bad checkpoint never stops the others.

Names are matched exactly: lower case, the step in ASCII digits ``0-9`` (``checkpoint-٣`` or
``checkpoint-１３`` is no step 3 or 13). A name that looks like a checkpoint but does not match
(``Checkpoint-13``, ``checkpoint-1e3``, ``checkpoint-12 (copy)``, ``step_12.bak``), a dangling
symlink and a file with a checkpoint's name are listed by ``skipped`` with the reason, never
dropped in silence. ``Checkpoint-13`` is skipped, not scored: training libraries write lower-case
names, so a capitalised one is a copy made by hand; renaming it to ``checkpoint-13`` scores it.
"""

from __future__ import annotations

import json
import re
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

NAME_PATTERNS = (
    re.compile(r"^checkpoint-([0-9]+)$", re.ASCII),
    re.compile(r"^step[_-]([0-9]+)$", re.ASCII),
    re.compile(r"^global_step([0-9]+)$", re.ASCII),
    re.compile(r"^epoch[_-]([0-9]+)$", re.ASCII),
)
NAME_FORMS = "checkpoint-N, step_N, step-N, global_stepN or epoch_N"
# A name that starts like a checkpoint's and holds a digit (of any script): listed when it is skipped.
LOOKS_LIKE = re.compile(r"^\W*(checkpoint|ckpt|step|global[_-]?step|epoch)\W*\w*?\d", re.IGNORECASE)
FULL_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                "pytorch_model.bin.index.json")
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
PARTIAL_SUFFIXES = (".tmp", ".partial", ".incomplete", ".lock")


class CheckpointError(Exception):
    """One checkpoint cannot be scored as it is: one line naming its file and the fix."""


@dataclass
class Checkpoint:
    path: Path
    step: int
    kind: str = "full"  # "full" or "lora"
    base: str | None = None
    lora_rank: int | None = None
    error: str | None = None
    files: list[Path] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.name

    def mtime(self) -> float:
        """Newest modification time among the checkpoint's files (a re-save changes it)."""
        times = [f.stat().st_mtime for f in self.path.rglob("*") if f.is_file()]
        return max(times, default=self.path.stat().st_mtime)


def step_of(name: str) -> int | None:
    for pattern in NAME_PATTERNS:
        m = pattern.match(name)
        if m:
            return int(m.group(1))
    return None


def skipped(run_dir: Path) -> list[tuple[Path, str]]:
    """Entries of ``run_dir`` that look like checkpoints but are not scored, each with the reason
    (one line naming the fix): a name that does not match exactly, a file, a dangling symlink."""
    out = []
    for child in sorted(Path(run_dir).iterdir()):
        name = child.name
        if not LOOKS_LIKE.match(name):
            continue
        if step_of(name) is not None:
            if child.is_symlink() and not child.exists():
                out.append((child, f"a symlink to {child.readlink()}, which does not exist; fix or remove the link"))
            elif not child.is_dir():
                out.append((child, "a file, not a checkpoint folder; move it out of the run folder"))
            continue
        ascii_name = "".join(str(unicodedata.decimal(c)) if c.isdecimal() and not c.isascii() else c for c in name)
        if ascii_name != name and step_of(ascii_name) is not None:
            reason = f"its step is not written in ASCII digits 0-9; rename it to {ascii_name} to score it"
        elif step_of(name.lower()) is not None:
            reason = f"names are matched in lower case; rename it to {name.lower()} to score it"
        else:
            reason = f"not one of {NAME_FORMS} (N in digits 0-9); rename it if it is a checkpoint"
        out.append((child, reason))
    return out


def inspect(path: Path, step: int, base: str | None = None) -> Checkpoint:
    """Classify one checkpoint folder; ``error`` is set when it cannot be evaluated."""
    ckpt = Checkpoint(path=path, step=step)
    partial = [f.name for f in path.iterdir() if f.name.endswith(PARTIAL_SUFFIXES)]
    adapter_cfg = path / "adapter_config.json"
    if partial:
        ckpt.error = f"{path}: still being written ({', '.join(sorted(partial))}); wait for the save to finish"
        return ckpt
    if adapter_cfg.is_file():
        ckpt.kind = "lora"
        try:
            cfg = json.loads(adapter_cfg.read_text())
        except (OSError, json.JSONDecodeError) as err:
            ckpt.error = f"{adapter_cfg}: unreadable adapter config ({err}); re-save the adapter"
            return ckpt
        ckpt.base = base or cfg.get("base_model_name_or_path")
        ckpt.lora_rank = cfg.get("r")
        weights = [path / w for w in ADAPTER_WEIGHTS if (path / w).is_file()]
        if not weights:
            ckpt.error = f"{path}: adapter_config.json but no adapter weights ({' or '.join(ADAPTER_WEIGHTS)}); re-save the adapter"
        elif not ckpt.base:
            ckpt.error = f"{path}: adapter has no base_model_name_or_path; pass --base MODEL"
        elif not model_exists(ckpt.base):
            ckpt.error = (f"{path}: base model {ckpt.base} not found (offline, no such folder); "
                          "pass --base with a local model folder")
        ckpt.files = weights
        return ckpt
    if not (path / "config.json").is_file():
        ckpt.error = f"{path}: neither config.json (full checkpoint) nor adapter_config.json (LoRA); not a model checkpoint"
        return ckpt
    weights = [path / w for w in FULL_WEIGHTS if (path / w).is_file()]
    if not weights:
        ckpt.error = f"{path}: config.json but no weights ({' or '.join(FULL_WEIGHTS[:2])}); the save is incomplete, re-save it"
    ckpt.files = weights
    return ckpt


def model_exists(base: str) -> bool:
    """A local model folder, or a Hub id whose config is in the local cache (usable offline)."""
    if Path(base).expanduser().is_dir():
        return True
    try:  # a Hub id is only usable offline when it is already in the local cache
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(base, "config.json"), str)
    except Exception:
        return False


def discover(run_dir: Path, base: str | None = None) -> list[Checkpoint]:
    """Checkpoints of ``run_dir`` ordered by step; duplicate steps are marked as errors."""
    run_dir = Path(run_dir)
    found = []
    for child in sorted(run_dir.iterdir()):
        step = step_of(child.name) if child.is_dir() else None
        if step is not None:
            found.append(inspect(child, step, base))
    found.sort(key=lambda c: (c.step, c.name))
    by_step: dict[int, list[Checkpoint]] = {}
    for c in found:
        by_step.setdefault(c.step, []).append(c)
    for step, group in by_step.items():
        if len(group) > 1:
            names = ", ".join(str(c.path) for c in group)
            for c in group:
                c.error = f"{c.path}: step {step} is claimed by {len(group)} checkpoints ({names}); rename or remove all but one"
    return found


def settled(ckpt: Checkpoint, quiet_seconds: float) -> bool:
    """True when no file of the checkpoint changed in the last ``quiet_seconds`` (for --watch)."""
    return time.time() - ckpt.mtime() >= quiet_seconds


def check_weights(ckpt: Checkpoint) -> str | None:
    """Open every safetensors file's header: a truncated or corrupt file fails here, not mid-run."""
    for f in ckpt.files:
        if f.suffix != ".safetensors":
            continue
        try:
            from safetensors import safe_open

            with safe_open(str(f), framework="pt") as handle:
                handle.keys()
        except Exception as err:  # safetensors raises several types for bad files
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            return f"{f}: corrupt weights file ({reason}); re-save the checkpoint or delete it"
    return None


# Whether a loaded model can take another checkpoint's weights in place (the sweep's backends).

CONFIG_KEYS_THAT_MAY_DIFFER = ("_name_or_path", "transformers_version")


def same_config(old: str | Path | None, new: Path) -> bool:
    """Two model folders with the same config.json, but for bookkeeping keys: a loaded model or
    engine keeps the old one's RoPE, context length and the rest, so anything else forces a
    fresh load."""
    try:
        a = json.loads((Path(old) / "config.json").read_text())
        b = json.loads((Path(new) / "config.json").read_text())
    except (OSError, TypeError, json.JSONDecodeError):
        return False
    for key in CONFIG_KEYS_THAT_MAY_DIFFER:
        a.pop(key, None)
        b.pop(key, None)
    return a == b


def tensor_names(folder: Path) -> set[str] | None:
    """The tensor names of a safetensors checkpoint, from the headers; None when not safetensors."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    try:
        if index.is_file():
            return set(json.loads(index.read_text())["weight_map"])
        with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
            return set(handle.keys())
    except Exception:
        return None


def same_tensor_names(old: str | Path | None, new: Path) -> bool:
    """vLLM keeps the old value of a tensor the new checkpoint lacks: swap only complete sets."""
    if old is None:
        return False
    a, b = tensor_names(Path(old)), tensor_names(Path(new))
    return a is not None and a == b


def same_tokenizer(old: str | Path | None, new: Path) -> bool:
    """lm-eval's VLLM keeps the tokenizer it was started with: only swap weights under the same one."""
    names = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
             "generation_config.json", "chat_template.jinja")
    for name in names:
        a, b = Path(old or "") / name, Path(new) / name
        if a.is_file() != b.is_file() or (a.is_file() and a.read_bytes() != b.read_bytes()):
            return False
    return True
