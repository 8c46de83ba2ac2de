"""One adapter per experiment tracker: open its run, log metrics at a training step, write the
summary, close. Each is imported only when it is asked for; each logs through the tracker's public
API. ``key`` names the run the metrics go to (the ledger's key), computed before the run opens.

Without a run named in ``--report_args``, a sweep's run is named after its output folder, so that a
rerun and every shard log into the same run (W&B: an id made from the folder; MLflow: the run id the
first process created, kept in the output folder; Trackio: the folder's name; TensorBoard: the
folder's ``tensorboard/``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
from functools import cached_property
from pathlib import Path

from ..errors import CFTasksError
from ..files import atomic_write

DEFAULT_PROJECT = "cf-tasks"
STEP_METRIC = "train/global_step"  # transformers' W&B integration's step axis: the curves share it
SUMMARY_TAG = "cf_tasks/summary"
REACH_TIMEOUT = 10.0  # seconds an MLflow tracking server has to answer before a sweep starts


class TrackerError(CFTasksError, ValueError):
    """A bad --report_to or --report_args: one line naming the flag and the fix, exit 2."""

    exit_code = 2


def _digest(text: str, n: int = 16) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def _where(out: Path | None) -> str:
    return str(Path(out).resolve()) if out else ""


def redact_uri(uri: str) -> str:
    """A URI without its user:password part."""
    return re.sub(r"//[^/@]*@", "//***@", uri)


class Tracker:
    name = ""

    def __init__(self, args: dict, out: Path | None):
        self.args, self.out = dict(args), Path(out) if out else None

    @cached_property
    def key(self) -> str:
        raise NotImplementedError

    def check(self) -> None:
        """What can be known before any model loads (TrackerError, one line); nothing by default."""

    def open(self) -> None:
        raise NotImplementedError

    def log(self, metrics: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def summary(self, values: dict[str, object], step: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class TensorBoard(Tracker):
    """Event files in ``tensorboard.log_dir`` (a trainer's ``logging_dir`` puts the curves beside its loss)."""

    name = "tensorboard"

    def log_dir(self) -> Path:
        if "log_dir" in self.args:
            return Path(self.args["log_dir"]).expanduser()
        return (self.out or Path(".")) / "tensorboard"

    @cached_property
    def key(self) -> str:
        return f"tensorboard:{self.log_dir().resolve()}"

    def open(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir().mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(log_dir=str(self.log_dir()), filename_suffix=".cf_tasks")

    def log(self, metrics, step):
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()

    def summary(self, values, step):
        lines = ["| metric | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in values.items()]
        self.writer.add_text(SUMMARY_TAG, "\n".join(lines), global_step=step)
        self.writer.flush()

    def close(self):
        if getattr(self, "writer", None) is not None:
            self.writer.close()


class WandB(Tracker):
    """A W&B run: ``wandb.id`` joins that run (resume); offline with ``wandb.mode=offline`` or WANDB_MODE."""

    name = "wandb"

    def run_id(self) -> str | None:
        if "id" in self.args:
            return self.args["id"]
        return f"cf-tasks-{_digest(_where(self.out), 12)}" if self.out else None

    @cached_property
    def key(self) -> str:
        project = self.args.get("project", DEFAULT_PROJECT)
        return f"wandb:{self.args.get('entity', '')}/{project}/{self.run_id() or 'new run ' + os.urandom(4).hex()}"

    def open(self):
        import wandb

        init = {"project": self.args.get("project", DEFAULT_PROJECT), "id": self.run_id(), "resume": "allow",
                "name": self.args.get("run_name") or (self.out.name if self.out else None),
                "entity": self.args.get("entity"), "group": self.args.get("group"), "mode": self.args.get("mode"),
                "dir": self.args.get("dir") or (str(self.out) if self.out else None), "reinit": "create_new",
                "settings": wandb.Settings(silent=True, console="off")}
        self.run = wandb.init(**{k: v for k, v in init.items() if v is not None})
        self.run.define_metric(STEP_METRIC)
        self.defined: set[str] = set()

    def log(self, metrics, step):
        for name in metrics:
            if name not in self.defined:
                self.run.define_metric(name, step_metric=STEP_METRIC)
                self.defined.add(name)
        self.run.log({**metrics, STEP_METRIC: step})

    def summary(self, values, step):
        self.run.summary.update(values)

    def close(self):
        if getattr(self, "run", None) is not None:
            self.run.finish()


class MLflow(Tracker):
    """An MLflow run: ``mlflow.run_id`` joins that run; otherwise the output folder's run, created once."""

    name = "mlflow"

    def uri(self) -> str:
        if "tracking_uri" in self.args:
            return self.args["tracking_uri"]
        if os.environ.get("MLFLOW_TRACKING_URI"):
            return os.environ["MLFLOW_TRACKING_URI"]
        return ((self.out or Path(".")) / "mlruns").resolve().as_uri()

    def experiment(self) -> str:
        return self.args.get("experiment_name") or self.args.get("project") or DEFAULT_PROJECT

    @cached_property
    def key(self) -> str:
        where = self.args.get("run_id") or f"{self.experiment()}@{_where(self.out) or 'new run ' + os.urandom(4).hex()}"
        return f"mlflow:{_digest(self.uri())}/{where}"

    def check(self):
        from mlflow.tracking import MlflowClient

        try:
            MlflowClient(tracking_uri=self.uri())  # builds the store: a refused or malformed URI fails here
        except Exception as err:
            reason = " ".join(str(err).split())[:400]
            raise TrackerError(f"--report_to mlflow: tracking URI {redact_uri(self.uri())} cannot be used ({reason}); "
                               "pass --report_args mlflow.tracking_uri=URI (a server, or sqlite:///PATH)") from None
        if self.uri().lower().startswith(("http://", "https://")):
            self._reach_server()

    def _reach_server(self) -> None:
        """A tracking server that does not answer at all is refused now, in one line: MLflow's client
        retries a refused connection for minutes before it gives up. Any HTTP answer (even an error
        status, or a TLS certificate MLflow may be told to accept) counts as reachable; the environment's
        proxy settings apply, as they do for MLflow."""
        import requests

        try:
            requests.get(self.uri().rstrip("/") + "/health", timeout=REACH_TIMEOUT, allow_redirects=False)
        except requests.exceptions.SSLError:
            return  # it answered; MLFLOW_TRACKING_INSECURE_TLS or a certificate path may settle the rest
        except (requests.ConnectionError, requests.Timeout) as err:
            reason = type(err).__name__
            raise TrackerError(f"--report_to mlflow: the tracking server {redact_uri(self.uri())} does not answer "
                               f"({reason}); start it, fix --report_args "
                               "mlflow.tracking_uri=URI, or drop mlflow from --report_to") from None

    def _run_file(self) -> Path | None:
        return self.out / "logged" / f"mlflow-run-{_digest(self.uri() + '|' + self.experiment())}.json" if self.out else None

    def open(self):
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri())
        if "run_id" in self.args:
            self.run_id = self.client.get_run(self.args["run_id"]).info.run_id  # an unknown id fails here
            return
        kept = self._run_file()
        if kept and kept.is_file():
            self.run_id = json.loads(kept.read_text())["run_id"]
            return
        exp = self.client.get_experiment_by_name(self.experiment())
        exp_id = exp.experiment_id if exp else self.client.create_experiment(self.experiment())
        run = self.client.create_run(exp_id, run_name=self.args.get("run_name") or (self.out.name if self.out else None),
                                     tags={"cf_tasks.output": _where(self.out)})
        self.run_id = run.info.run_id
        if kept:
            kept.parent.mkdir(parents=True, exist_ok=True)
            try:  # first process wins: a shard that created a run at the same time uses the winner's
                fd = os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                self.client.delete_run(self.run_id)
                self.run_id = json.loads(kept.read_text())["run_id"]
                return
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps({"run_id": self.run_id, "experiment": self.experiment(),
                                     "tracking_uri": redact_uri(self.uri())}) + "\n")

    def log(self, metrics, step):
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    def summary(self, values, step):
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in values.items()])


class Trackio(Tracker):
    """A Trackio run in its local database (or the Space it is set up to sync with)."""

    name = "trackio"

    def names(self) -> tuple[str, str | None]:
        return (self.args.get("project", DEFAULT_PROJECT),
                self.args.get("run_name") or (f"{self.out.name}-{_digest(_where(self.out), 6)}" if self.out else None))

    @cached_property
    def key(self) -> str:
        project, name = self.names()
        return f"trackio:{project}/{name or 'new run ' + os.urandom(4).hex()}"

    def open(self):
        import trackio

        project, name = self.names()
        # No CPU / GPU sampling: a joined run is the trainer's, and the scorer's load is not its. Trackio
        # prints its progress; it goes to stderr, so stdout keeps the sweep's own lines.
        with contextlib.redirect_stdout(sys.stderr):
            self.run = trackio.init(project=project, name=name, resume="allow", auto_log_cpu=False,
                                    auto_log_gpu=False)

    def log(self, metrics, step):
        self.run.log(metrics, step=step)

    def summary(self, values, step):
        numbers = {f"summary/{k}": float(v) for k, v in values.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) or isinstance(v, bool)}
        if numbers:
            self.run.log(numbers, step=step)

    def close(self):
        if getattr(self, "run", None) is not None:
            import trackio

            with contextlib.redirect_stdout(sys.stderr):
                # trackio.finish: the current run (this one, which init made current), finished and let go,
                # so that trackio does not finish it again, on stdout, when Python exits
                trackio.finish()


ADAPTERS = {t.name: t for t in (TensorBoard, WandB, MLflow, Trackio)}


def write_key_note(folder: Path, key: str) -> None:
    """The ledger folder's note of the run it stands for (no secret: a URI's password is never kept)."""
    atomic_write(folder / "run.json", (json.dumps({"run": redact_uri(key)}) + "\n").encode())
