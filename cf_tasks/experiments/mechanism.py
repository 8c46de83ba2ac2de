"""The mechanism of context-parametric inversion in a one-layer transformer (the paper's section 5).

*Context-Parametric Inversion: Why Instruction Finetuning May Not Actually Improve Context
Reliance* (Goyal et al., ICLR 2025), section 5 and appendix A.6, model the drop in context reliance
with one attention head over synthetic tokens ``[c, s, r]`` (context, subject, relation): the logits
after ``r`` are ``sum_y sigma_y W_H^T W_V phi(y)`` with ``sigma_y = softmax_y(phi(y)^T W_KQ phi(r))``
(their equation 4). This module builds that model with the paper's token geometry and runs it:

- **Embeddings** (assumptions 2-4): every subject is ``sqrt(1/2) s~ + sqrt(1/2) theta_S``, every
  context/answer token ``sqrt(1/2) a~ + sqrt(1/2) theta_C``, ``phi(r)`` orthogonal to both; all
  the ``~`` parts and the two shared directions orthonormal. ``phi`` and ``W_H = phi`` are frozen;
  ``W_KQ`` and ``W_V`` are trained. Cross-entropy on the answer token over the whole vocabulary
  (equation 5).
- **Pretraining**: ``W_V`` starts with a weak copy prior (the value of a context token points at
  itself: the paper's ``delta_C``) and learns subject -> answer facts from ``[s, r]`` points
  (``D_pre``) while ``W_KQ`` stays at 0, so that the fine-tuning starts with equal attention on
  context and subject (assumption 5).
- **Fine-tuning arms**: ``mix`` (context-critical C points ``[c, s_unknown, r] -> c`` and
  non-context-critical C+S points ``[a, s_known, r] -> a``, C+S-heavy), ``c_only``,
  ``counterfactual`` (the mix plus ``[c', s_known, r] -> c'`` with ``c'`` not the memorised answer,
  section 6) and ``qk_only`` (the mix with ``W_V`` frozen: proposition 1's setting and section 6's
  QK fine-tuning).
- **Measured at every step** (before the step's update, so step 0 is the pretrained model): on
  held-out counterfactual probes ``[c', s_known, r]`` (a memorised subject, a context token that no
  fine-tuning point uses) the attention on context and subject, the accuracy (argmax is the context
  token) and theorem 1's ``M_C = p(c') / (p(c') + p(a))``; the loss on the C and the C+S points; and
  proposition 1's quantities ``theta_C^T (-grad_{W_KQ} L) phi(r)`` and the same for ``theta_S``
  over the arm's fine-tuning set.

``run_study`` writes ``<arm>.csv`` (one row per step x seed), ``summary.csv`` (mean, standard
deviation, min and max across seeds per arm x step x quantity), ``<arm>.png`` and ``mechanism.json``
(the settings) to the output folder, all together once every arm has run. Deterministic given the seeds: every random draw
uses a ``torch.Generator`` seeded by the run's seed.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ARMS = ("mix", "c_only", "counterfactual", "qk_only")
ARM_TITLES = {
    "mix": "C + C+S (C+S-heavy)",
    "c_only": "C only",
    "counterfactual": "C + C+S + counterfactual",
    "qk_only": "C + C+S, W_V frozen (QK only)",
}
QUANTITIES = ("attn_context", "attn_subject", "loss_c", "loss_cs", "cf_acc", "cf_context_prob",
              "kq_push_context", "kq_push_subject")
COLUMNS = ("arm", "seed", "step", *QUANTITIES)


@dataclass(frozen=True)
class MechanismConfig:
    """Sizes and optimisation settings of one study; the defaults are the committed study's."""

    n_c: int = 24             # context-critical points (unknown subjects)
    n_cs: int = 72            # non-context-critical points (memorised subjects, context = answer)
    n_cf: int = 24            # counterfactual training points (counterfactual arm only)
    n_probe: int = 48         # held-out counterfactual probes
    copy_prior: float = 4.0   # logit of a context token's value on itself before fine-tuning
    memory: float = 0.5       # pretraining stops once sigma(W_H^T W_V phi(s))_a averages this (delta_M)
    init_std: float = 0.01    # seeded noise on W_KQ and W_V at initialisation
    pretrain_steps: int = 2000
    pretrain_lr: float = 400.0
    steps: int = 200          # fine-tuning steps
    lr: float = 3.0
    batch_size: int = 32

    @property
    def n_subjects(self) -> int:
        return self.n_c + self.n_cs + self.n_cf + self.n_probe

    @property
    def n_answers(self) -> int:
        # each subject has its own answer (assumption 1); the counterfactual contexts of the
        # training points and of the probes are answer tokens of nobody
        return self.n_subjects + self.n_cf + self.n_probe


class Geometry:
    """Token ids and the frozen embeddings: subjects, then answers, then the relation token."""

    def __init__(self, n_subjects: int, n_answers: int):
        import torch

        self.n_subjects, self.n_answers = n_subjects, n_answers
        self.vocab = n_subjects + n_answers + 1
        self.relation = self.vocab - 1
        dim = n_subjects + n_answers + 3
        self.theta_s, self.theta_c, r_dir = dim - 3, dim - 2, dim - 1
        phi = torch.zeros(self.vocab, dim, dtype=torch.float32)
        half = math.sqrt(0.5)
        for s in range(n_subjects):
            phi[s, s] = phi[s, self.theta_s] = half
        for k in range(n_answers):
            phi[n_subjects + k, n_subjects + k] = phi[n_subjects + k, self.theta_c] = half
        phi[self.relation, r_dir] = 1.0
        self.phi = phi
        self.dim = dim

    def answer(self, k):
        return self.n_subjects + k


def forward(phi, w_kq, w_v, tokens):
    """Logits (batch, vocab) at the last position and the attention (batch, length) of the last
    token on every position: equation 4 of the paper."""
    import torch

    emb = phi[tokens]                                    # (B, L, d)
    query = emb[:, -1]                                   # phi(r)
    scores = torch.einsum("bld,bd->bl", emb, query @ w_kq.T)  # phi(y)^T W_KQ phi(r)
    attn = torch.softmax(scores, dim=-1)
    mixed = torch.einsum("bl,bld->bd", attn, emb)
    logits = mixed @ w_v.T @ phi.T                       # phi(t)^T W_V sum_y sigma_y phi(y)
    return logits, attn


def _loss(phi, w_kq, w_v, tokens, targets):
    import torch

    logits, _ = forward(phi, w_kq, w_v, tokens)
    return torch.nn.functional.cross_entropy(logits, targets)


class Study:
    """The data of one seed: facts, fine-tuning sets, probes, and the pretrained weights."""

    def __init__(self, cfg: MechanismConfig, seed: int):
        import torch

        self.cfg, self.seed = cfg, seed
        self.gen = torch.Generator().manual_seed(seed)
        geo = self.geo = Geometry(cfg.n_subjects, cfg.n_answers)
        subj = torch.randperm(cfg.n_subjects, generator=self.gen)
        fact = torch.randperm(cfg.n_answers, generator=self.gen)  # fact[s]: the answer index of subject s
        spare = fact[cfg.n_subjects:]                         # answers of no subject
        cuts = torch.cumsum(torch.tensor([cfg.n_c, cfg.n_cs, cfg.n_cf, cfg.n_probe]), 0).tolist()
        c_subj, cs_subj, cf_subj, probe_subj = (subj[a:b] for a, b in zip([0, *cuts[:-1]], cuts))
        r = geo.relation

        def points(subjects, contexts):
            tokens = torch.stack([geo.answer(contexts), subjects, torch.full_like(subjects, r)], dim=1)
            return tokens, geo.answer(contexts)

        self.facts = {"subjects": subj, "answer": fact}
        self.sets = {
            "c": points(c_subj, fact[c_subj]),          # the answer is in the context only
            "cs": points(cs_subj, fact[cs_subj]),       # the context states the memorised answer
            "cf": points(cf_subj, spare[: cfg.n_cf]),   # the context contradicts the memorised answer
        }
        self.probe = points(probe_subj, spare[cfg.n_cf: cfg.n_cf + cfg.n_probe])
        self.probe_memory = geo.answer(fact[probe_subj])  # the memorised (parametric) answers
        known = torch.cat([cs_subj, cf_subj, probe_subj])
        self.pre = (torch.stack([known, torch.full_like(known, r)], dim=1), geo.answer(fact[known]))
        self.w_kq0, self.w_v0 = self._pretrain()

    def _pretrain(self):
        import torch

        cfg, geo = self.cfg, self.geo
        d = geo.dim
        w_kq = cfg.init_std * torch.randn(d, d, generator=self.gen, dtype=torch.float32)
        w_v = cfg.init_std * torch.randn(d, d, generator=self.gen, dtype=torch.float32)
        # copy prior: phi(a)^T W_V phi(c) = copy_prior when a == c, 0 for other answers
        ans = torch.arange(geo.n_subjects, geo.n_subjects + geo.n_answers)
        w_v[ans, ans] += 2 * cfg.copy_prior
        w_v.requires_grad_(True)
        tokens, targets = self.pre
        subjects = geo.phi[tokens[:, 0]]
        for _ in range(cfg.pretrain_steps):  # full-batch gradient descent on W_V; W_KQ stays put
            with torch.no_grad():
                memory = torch.softmax(subjects @ w_v.T @ geo.phi.T, dim=-1).gather(1, targets[:, None]).mean()
            if memory >= cfg.memory:
                break
            loss = _loss(geo.phi, w_kq, w_v, tokens, targets)
            (grad,) = torch.autograd.grad(loss, w_v)
            with torch.no_grad():
                w_v -= cfg.pretrain_lr * grad
        return w_kq.detach(), w_v.detach()

    def train_set(self, arm: str):
        import torch

        names = {"mix": ("c", "cs"), "c_only": ("c",), "counterfactual": ("c", "cs", "cf"), "qk_only": ("c", "cs")}[arm]
        return (torch.cat([self.sets[n][0] for n in names]), torch.cat([self.sets[n][1] for n in names]))


def measure(study: Study, w_kq, w_v, train) -> dict[str, float]:
    """Every recorded quantity for weights ``(w_kq, w_v)``; ``train`` is the arm's fine-tuning set."""
    import torch

    geo = study.geo
    with torch.no_grad():
        logits, attn = forward(geo.phi, w_kq, w_v, study.probe[0])
        probs = torch.softmax(logits, dim=-1)
        ctx, mem = study.probe[1], study.probe_memory
        p_c, p_a = probs.gather(1, ctx[:, None])[:, 0], probs.gather(1, mem[:, None])[:, 0]
        out = {
            "attn_context": attn[:, 0].mean().item(),
            "attn_subject": attn[:, 1].mean().item(),
            "loss_c": _loss(geo.phi, w_kq, w_v, *study.sets["c"]).item(),
            "loss_cs": _loss(geo.phi, w_kq, w_v, *study.sets["cs"]).item(),
            "cf_acc": (logits.argmax(-1) == ctx).float().mean().item(),
            "cf_context_prob": (p_c / (p_c + p_a)).mean().item(),
        }
    kq = w_kq.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(_loss(geo.phi, kq, w_v, *train), kq)
    r_dir = geo.phi[geo.relation]
    push = -grad @ r_dir                                   # (-grad W_KQ) phi(r)
    out["kq_push_context"] = push[geo.theta_c].item()
    out["kq_push_subject"] = push[geo.theta_s].item()
    return out


def finetune(study: Study, arm: str, record=None):
    """Fine-tune the pretrained weights on ``arm``'s set with mini-batch SGD; returns one row per
    step (``cfg.steps + 1`` rows: step 0 is the pretrained model) and the final weights.
    ``record(step, w_kq, w_v, batch)`` is called before each update (for tests)."""
    import torch

    cfg, geo = study.cfg, study.geo
    gen = torch.Generator().manual_seed(study.seed * 1000 + ARMS.index(arm))
    w_kq = study.w_kq0.clone().requires_grad_(True)
    w_v = study.w_v0.clone().requires_grad_(arm != "qk_only")
    params = [w_kq] if arm == "qk_only" else [w_kq, w_v]
    tokens, targets = study.train_set(arm)
    rows = []
    for step in range(cfg.steps + 1):
        rows.append({"arm": arm, "seed": study.seed, "step": step, **measure(study, w_kq.detach(), w_v.detach(),
                                                                             (tokens, targets))})
        if step == cfg.steps:
            break
        batch = torch.randint(len(tokens), (cfg.batch_size,), generator=gen)
        if record is not None:
            record(step, w_kq.detach().clone(), w_v.detach().clone(), batch)
        grads = torch.autograd.grad(_loss(geo.phi, w_kq, w_v, tokens[batch], targets[batch]), params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= cfg.lr * g
    return rows, (w_kq.detach(), w_v.detach())


def summarise(rows: list[dict]) -> list[dict]:
    """Mean, standard deviation (n-1), min and max across seeds per arm x step x quantity."""
    import statistics

    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["arm"], row["step"]), []).append(row)
    out = []
    for (arm, step), group in groups.items():
        for q in QUANTITIES:
            values = [g[q] for g in group]
            out.append({"arm": arm, "step": step, "quantity": q, "n_seeds": len(values),
                        "mean": statistics.fmean(values),
                        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                        "min": min(values), "max": max(values)})
    return out


def _csv_bytes(rows: list[dict], columns) -> bytes:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    return buf.getvalue().encode()


def plot_arm(summary: list[dict], arm: str) -> bytes:
    """A PNG of one arm: attention, losses and the counterfactual probes (mean, min-max band)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("attention on ...", (("attn_context", "context"), ("attn_subject", "subject"))),
              ("loss", (("loss_c", "C points"), ("loss_cs", "C+S points"))),
              ("counterfactual probes", (("cf_acc", "accuracy"), ("cf_context_prob", "M_C"))))
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    for ax, (title, series) in zip(axes, panels):
        for q, label in series:
            pts = sorted((r["step"], r["mean"], r["min"], r["max"]) for r in summary
                         if r["arm"] == arm and r["quantity"] == q)
            steps = [p[0] for p in pts]
            line, = ax.plot(steps, [p[1] for p in pts], label=label)
            ax.fill_between(steps, [p[2] for p in pts], [p[3] for p in pts], alpha=0.25, color=line.get_color())
        ax.set_title(title)
        ax.set_xlabel("fine-tuning step")
        ax.legend(fontsize=8)
    n = max((r["n_seeds"] for r in summary if r["arm"] == arm), default=0)
    fig.suptitle(f"{ARM_TITLES[arm]}: mean over {n} seeds, band = min-max")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


RECORD = "mechanism.json"  # the settings the folder's outputs are from, written last


def output_names(arms=ARMS) -> set[str]:
    """Every file a study writes (with plots), so that a rerun removes what it does not write again."""
    return {"summary.csv", *(f"{arm}.csv" for arm in arms), *(f"{arm}.png" for arm in arms)}


def run_study(output_path: Path, seeds: list[int], cfg: MechanismConfig = MechanismConfig(),
              arms=ARMS, plots: bool = True) -> list[dict]:
    """Run every arm for every seed; write the CSVs (and plots) to ``output_path``; returns the
    summary rows.

    Nothing is written until every arm has run: the outputs are then staged in a temp folder and
    land together (``cf_tasks.files.publish``) with ``mechanism.json``, the settings they are from,
    written last. A rerun killed part way leaves the previous run's files as they were, and a rerun
    with ``plots=False`` removes the previous plots; one run at a time per folder."""
    from ..files import OutputLock, atomic_write, clean_stages, publish, stage_dir

    output_path = Path(output_path)
    output_path.mkdir(parents=True, exist_ok=True)
    with OutputLock(output_path, "mechanism"):
        clean_stages(output_path, "mechanism")
        studies = [Study(cfg, seed) for seed in seeds]
        per_arm = {arm: [row for study in studies for row in finetune(study, arm)[0]] for arm in arms}
        summary = summarise([row for rows in per_arm.values() for row in rows])
        stage = stage_dir(output_path, "mechanism")
        try:
            for arm, rows in per_arm.items():
                atomic_write(stage / f"{arm}.csv", _csv_bytes(rows, COLUMNS))
            atomic_write(stage / "summary.csv",
                         _csv_bytes(summary, ("arm", "step", "quantity", "n_seeds", "mean", "std", "min", "max")))
            if plots:
                for arm in arms:
                    atomic_write(stage / f"{arm}.png", plot_arm(summary, arm))
        except BaseException:
            import shutil

            shutil.rmtree(stage, ignore_errors=True)
            raise
        record = {"seeds": list(seeds), "arms": list(arms), "plots": plots, "config": asdict(cfg)}
        publish(stage, output_path, RECORD, record, output_names())
    return summary
