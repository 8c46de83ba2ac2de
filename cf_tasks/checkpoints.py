"""Finding and checking the checkpoints of a fine-tuning run folder.

A checkpoint is a sub-folder named ``checkpoint-N``, ``step_N``, ``step-N``, ``global_stepN`` or
``epoch_N``. It is a full checkpoint (``config.json`` plus weights) or a LoRA adapter
(``adapter_config.json`` plus adapter weights; its base model comes from the adapter config or
``--base``). Problems are recorded per checkpoint as one line that names the path and the fix, so
one bad checkpoint never stops the others.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

NAME_PATTERNS = (
    re.compile(r"^checkpoint-(\d+)$"),
    re.compile(r"^step[_-](\d+)$"),
    re.compile(r"^global_step(\d+)$"),
    re.compile(r"^epoch[_-](\d+)$"),
)
FULL_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                "pytorch_model.bin.index.json")
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
PARTIAL_SUFFIXES = (".tmp", ".partial", ".incomplete", ".lock")


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
        elif not _base_exists(ckpt.base):
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


def _base_exists(base: str) -> bool:
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
