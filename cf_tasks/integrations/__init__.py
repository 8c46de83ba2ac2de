"""cf-tasks inside other tools' training loops: ``CFTasksCallback``, a transformers / TRL
``TrainerCallback`` that scores each saved checkpoint and reports the curves to the trainer's own
``report_to`` integrations at the checkpoint's step."""

from .callback import CFTasksCallback

__all__ = ["CFTasksCallback"]
