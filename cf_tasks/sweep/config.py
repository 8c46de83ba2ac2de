"""The sweep's settings and its one-line error: what every module of the sweep shares."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import CFTasksError

LOCK_TIMEOUT = 6 * 3600.0  # a claim of another host older than this is taken over


class SweepError(CFTasksError):
    """A problem with the whole sweep (no checkpoints, bad arguments): one line, exit 2."""

    exit_code = 2


@dataclass
class SweepConfig:
    run_dir: Path
    tasks: list[str]
    output_path: Path
    backend: str = "hf"
    base: str | None = None
    limit: float | None = None
    batch_size: int | str | None = 1  # lm-eval's default; None (the command line's): hf 8 on a CPU, else 1
    include_base: bool = False
    shard: tuple[int, int] = (0, 1)
    watch: bool = False
    poll_interval: float = 30.0
    settle_seconds: float = 10.0
    max_polls: int | None = None
    device: str | None = None
    tensor_parallel_size: int | None = None  # None: 1, or --model_args tensor_parallel_size
    model_args: str | dict | None = None  # lm-eval's key=value,key=value (see model_args.py)
    apply_chat_template: bool = False
    metadata: dict | None = None
    lora_group: int = 4
    lock_timeout: float = LOCK_TIMEOUT  # a claim older than this is taken over (other hosts' claims)
    alpha: float = 0.05  # significance level of the summary's paired tests (stats.py)
    peak_step: int | None = None  # the summary tests rise and fall at this step, declared in advance (stats.py)
    primary: tuple[str, ...] = ()  # series or tasks declared primary: Holm among them first (stats.gated_holm)
    knowledge: bool = True  # the knowledge probe on the knowledge-conflict tasks (cf_tasks/known.py)
    agree: bool = True  # each knowledge-conflict task's agreeing twin beside it, where installed
    attention: bool = False  # also measure context_attention (cf_tasks.attention; hf backend only)
    timings: bool = False  # print and write the seconds of each phase (timings.py)
    quiet: bool = False  # print only failures: no progress bar, summary table or closing line
    report_to: str | None = None  # experiment trackers, comma-separated (cf_tasks.trackers)
    report_args: str | None = None  # their runs: key=value pairs (cf_tasks.trackers)
