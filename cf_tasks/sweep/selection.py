"""Which checkpoints a sweep process scores and where each was found: its shard of the run's
checkpoints (``--shard``, or ``auto`` from a Slurm job array or torchrun), the base model as a
checkpoint (``--include_base``), and each checkpoint's place (the key of its failures and of its
rows' run and name)."""

from __future__ import annotations

import os
from pathlib import Path

from ..checkpoints import Checkpoint
from .config import SweepConfig, SweepError


def select_shard(checkpoints: list[Checkpoint], shard: tuple[int, int]) -> list[Checkpoint]:
    """The checkpoints of shard I/N: every N-th, from the I-th."""
    index, count = shard
    return [c for i, c in enumerate(checkpoints) if i % count == index]


def shard_from_env(env: dict | None = None) -> tuple[int, int]:
    """``--shard auto``: I/N from a Slurm job array (SLURM_ARRAY_TASK_ID counted from
    SLURM_ARRAY_TASK_MIN in steps of SLURM_ARRAY_TASK_STEP, of SLURM_ARRAY_TASK_COUNT), else from
    RANK/WORLD_SIZE (torchrun), else 0/1."""
    env = os.environ if env is None else env
    names = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_STEP",
             "RANK", "WORLD_SIZE")
    bad = next((n for n in names if n in env and not str(env[n]).strip().isascii()), None)
    if bad:  # int() would read other scripts' digits
        raise ValueError(f"{bad}={env[bad]!r} is not in ASCII digits")
    if "SLURM_ARRAY_TASK_ID" in env and "SLURM_ARRAY_TASK_COUNT" in env:
        index = (int(env["SLURM_ARRAY_TASK_ID"]) - int(env.get("SLURM_ARRAY_TASK_MIN", 0))) // int(
            env.get("SLURM_ARRAY_TASK_STEP", 1))
        count = int(env["SLURM_ARRAY_TASK_COUNT"])
    elif "RANK" in env and "WORLD_SIZE" in env:
        index, count = int(env["RANK"]), int(env["WORLD_SIZE"])
    else:
        return 0, 1
    if not 0 <= index < count:
        raise SweepError(f"--shard auto: index {index} is outside 0..{count - 1} (from the Slurm array or RANK/"
                         "WORLD_SIZE variables); pass --shard I/N")
    return index, count


def base_checkpoint(cfg: SweepConfig, checkpoints: list[Checkpoint]) -> Checkpoint | None:
    """The base model as a checkpoint of step 0 (``--base``, else the LoRA adapters' base); None without one."""
    base = cfg.base or next((c.base for c in checkpoints if c.kind == "lora" and c.base), None)
    if not base:
        return None
    return Checkpoint(path=Path(base), step=0, kind="base", base=base)


def _place_key(run_dir: Path, path: Path) -> str:
    """A checkpoint's place: its folder's path in the run folder, the run folder resolved but not
    the checkpoint (a run of links into another run's checkpoints is a place of its own, and so is
    each of two links to one folder)."""
    try:
        return str(run_dir.resolve() / Path(path).relative_to(run_dir))
    except ValueError:
        return str(Path(path).resolve())


def place_of(run_dir: Path, c: Checkpoint) -> dict:
    """Where a checkpoint was found: the key of its failures and of its rows' run and name."""
    base = c.kind == "base"
    try:
        mtime = c.mtime() if not base and c.path.exists() else 0.0
    except OSError:
        mtime = 0.0
    return {"place": f"base:{c.base}" if base else _place_key(run_dir, c.path), "run": str(run_dir.resolve()),
            "name": "base" if base else c.name, "step": c.step, "path": str(c.path), "kind": c.kind, "mtime": mtime,
            "model": c.base if c.kind in ("lora", "base") else str(c.path)}
