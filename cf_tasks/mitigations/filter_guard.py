"""What keeps ``cf-tasks filter-data`` as careful as the sweep: its checks before any work and the
way its outputs land.

- The input is never among the outputs: a JSONL file named like an output in the output folder
  (``kept.jsonl``, ``dropped.jsonl``, ...), the same file under another name (a link), or a
  ``datasets`` folder that is, holds or sits in an output, is refused in one line before any work.
- The model is known by its content, as the sweep knows a checkpoint (``folder_identity``: every
  model file's name, size and full digest), so weights swapped for another model's, even with the
  old time stamps restored, never reuse the old model's scores. Digests are cached under the
  cf-tasks cache folder, keyed by each file's path, size, time stamps and inode.
- A model folder without weights, with a weights file that is corrupt, cut short or still being
  written, and a device that is no device or one the machine lacks, are each one line, exit 2,
  before the data is read.
- One writer per output folder (``cf_tasks.files.OutputLock`` on ``.filter-data.lock``, held for
  the whole run); a second run into the same folder is refused in one line.
- A run's outputs are written into a temp folder inside the output folder and land together
  (``cf_tasks.files.publish``): the previous run's record ``filter.json`` goes first, an output of
  an earlier run that this one does not write (``kept/`` after a JSONL input) is removed, and the
  new record, naming the settings, the input and the model the outputs are from, comes last.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import CFTasksError
from ..checkpoints import folder_identity, weights_problem

RECORD = "filter.json"
LOCK = ".filter-data.lock"
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "model*.bin", "tf_model.h5", "flax_model.msgpack",
                   "adapter_model.safetensors", "adapter_model.bin")


class GuardError(CFTasksError):
    """A refused argument: one line, exit 2 (``FilterError`` of the command)."""

    exit_code = 2


def output_names(kept: str, dropped: str, fixed: tuple[str, ...]) -> set[str]:
    return {f"{kept}.jsonl", f"{dropped}.jsonl", kept, dropped, RECORD, LOCK, *fixed}


def check_input_not_output(data: str, out: Path, names: set[str]) -> None:
    """Refuse (``GuardError``) an input that this run's outputs would replace or sit inside."""
    if out.exists() and not out.is_dir():
        raise GuardError(f"--output_path {out} is a file, not a folder; pass a folder (it is created if missing)")
    path = Path(data).expanduser()
    if not path.exists():
        return  # a Hub dataset id
    src, dest = path.resolve(), out.expanduser().resolve()
    fix = f"pass another --output_path (or move the input out of {out} first)"

    def within(a: Path, b: Path) -> bool:
        return a == b or b in a.parents

    if path.is_dir() and within(dest, src):
        raise GuardError(f"--output_path {out} is inside the input folder {data}, whose files it would change; "
                         "pass an output folder outside it")
    for name in sorted(names):
        target = dest / name
        if within(src, target):
            raise GuardError(f"{data} would be replaced by this run's output {target}; {fix}")
        if path.is_file() and target.is_file() and os.path.samefile(path, target):
            raise GuardError(f"{data} is the same file as this run's output {target}; {fix}")
    if src.parent == dest and src.name.startswith("scoring-") and src.suffix == ".jsonl":
        raise GuardError(f"{data} is a scoring log of the output folder {out}, which this run appends to; {fix}")


def check_output_outside_model(model: str | None, out: Path) -> None:
    """An output folder inside the model folder would change the model's content at each write."""
    folder = Path(model).expanduser() if model else None
    if folder is not None and folder.is_dir():
        dest, src = out.expanduser().resolve(), folder.resolve()
        if dest == src or src in dest.parents:
            raise GuardError(f"--output_path {out} is inside the model folder {model}, whose content it would "
                             "change; pass an output folder outside it")


def check_device(device: str | None) -> None:
    if device is None:
        return
    from ..evaluate import device_problem

    problem = device_problem(device, f"--device {device}", " or leave it out")
    if problem:
        raise GuardError(problem)


def check_model_folder(model: str) -> None:
    """A local model folder has weights, and each safetensors file's header reads."""
    folder = Path(model).expanduser()
    if not folder.is_dir():
        return
    files = sorted({f for pattern in WEIGHT_PATTERNS for f in folder.glob(pattern) if f.is_file()})
    if not files:
        raise GuardError(f"--model {model}: a model folder without weights (no *.safetensors or pytorch_model.bin); "
                         "pass a folder written by save_pretrained, or save the model there again")
    problem = weights_problem(files)
    if problem:
        raise GuardError(f"--model {model}: {problem}")


def model_content_id(model: str) -> str:
    """The model's content id (the sweep's ``folder_identity``); for a Hub id, that of its files in
    the local cache, else the id itself (the Hub serves one revision's files under it)."""
    folder = Path(model).expanduser()
    if not folder.is_dir():
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(model, local_files_only=True))
        except Exception:  # not cached, or not a Hub id: the name is all there is to go by
            return model
    from ..default_model import cache_root

    return folder_identity(folder, cache=cache_root() / "digests")
