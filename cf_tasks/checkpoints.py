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

A model folder is known by its content (``folder_identity``: its model files' names, sizes and full
digests), by the sweep's store and by ``cf-tasks filter-data`` alike.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from .errors import CFTasksError
from .files import atomic_write

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


class CheckpointError(CFTasksError):
    """One checkpoint cannot be scored as it is: one line naming its file and the fix. The sweep
    counts it as a failed checkpoint (exit 1)."""

    exit_code = 1


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


WRITING_SECONDS = 60.0  # a weights file modified this recently may still be being written


def check_weights(ckpt: Checkpoint) -> str | None:
    """Open every safetensors file's header: a truncated or corrupt file fails here, not mid-run."""
    return weights_problem(ckpt.files)


def _declared_size(path) -> int | None:
    """The size a safetensors file's header says the file has (header plus the end of its last
    tensor); None when the header cannot be read."""
    try:
        with open(path, "rb") as fh:
            length = int.from_bytes(fh.read(8), "little")
            if not 0 < length < 100 << 20:
                return None
            header = json.loads(fh.read(length))
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
        return 8 + length + max(ends, default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None


def weights_problem(files) -> str | None:
    """One line for the first safetensors file of ``files`` that cannot be opened, naming the cause:
    removed while checked, still being written (shorter than its header says, or changed during the
    check, and modified within ``WRITING_SECONDS``), or corrupt; None when every header reads."""
    gone = "{f}: the weights file was removed while it was checked; save the checkpoint again or run again"
    for f in files:
        if Path(f).suffix != ".safetensors":
            continue
        try:
            before = os.stat(f)
        except OSError:
            return gone.format(f=f)
        try:
            from safetensors import safe_open

            with safe_open(str(f), framework="pt") as handle:
                handle.keys()
            declared = _declared_size(f)
            if declared is not None and os.stat(f).st_size < declared:
                raise ValueError(f"the file ends before its last tensor ({os.stat(f).st_size} of {declared} bytes)")
        except Exception as err:  # safetensors raises several types for bad files
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            try:
                after = os.stat(f)
            except OSError:
                return gone.format(f=f)
            age = time.time() - after.st_mtime
            declared = _declared_size(f)
            changed = (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns)
            short = declared is not None and after.st_size < declared
            if changed or (short and age < WRITING_SECONDS):
                return (f"{f}: the weights file is still being written ({after.st_size} bytes so far, modified "
                        f"{max(age, 0):.0f} s ago); wait for the save to finish and run again")
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


# ---------------------------------------------------------------- content ids (the sweep's store, filter-data)
CHUNK = 8 << 20  # bytes read per hash update
DIGEST = "xxh3_128"  # the name of the file digest, stored with each cached digest
NOT_MODEL_FILES = ("optimizer", "scheduler", "rng_state", "scaler", "trainer_state", "training_args")


def _full_digest(path: Path) -> bytes:
    """XXH3-128 of every byte of ``path``: about ten times the speed of SHA-256 or BLAKE2b (a fast,
    non-cryptographic hash is enough to tell checkpoints apart; nobody forges weights to collide)."""
    import xxhash

    h = xxhash.xxh3_128()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return h.digest()


def _stamp(path: Path) -> dict:
    st = os.stat(path)
    return {"path": str(Path(path).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns, "inode": st.st_ino}


def file_digest(path: Path, cache: Path | None = None) -> bytes:
    """The full digest of ``path``; with ``cache`` (a folder) reused while the file's path, size,
    modification and change times and inode are those it was computed for."""
    if cache is None:
        return _full_digest(path)
    stamp = _stamp(path)
    entry = Path(cache) / f"{hashlib.sha256(stamp['path'].encode()).hexdigest()[:32]}.json"
    try:
        known = json.loads(entry.read_text())
        if {k: known.get(k) for k in stamp} == stamp:
            return bytes.fromhex(known[DIGEST])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # no entry, or one damaged: compute it again
    digest = _full_digest(path)
    if _stamp(path) == stamp:  # not rewritten while we read it
        with contextlib.suppress(OSError):
            entry.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(entry, (json.dumps({**stamp, DIGEST: digest.hex()}, indent=2, sort_keys=True) + "\n").encode())
    return digest


def folder_identity(folder: Path, extra: str = "", cache: Path | None = None) -> str:
    """A content id of a model folder: its model files' relative names, sizes and full digests
    (optimizer and trainer state, hidden and temp files left out)."""
    h = hashlib.sha256(extra.encode())
    for f in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        rel = f.relative_to(folder).as_posix()
        if any(part.startswith(".") for part in rel.split("/")) or f.name.startswith(NOT_MODEL_FILES):
            continue
        size = f.stat().st_size
        h.update(f"{rel}\0{size}\0".encode())
        h.update(file_digest(f, cache))
    return h.hexdigest()[:24]
