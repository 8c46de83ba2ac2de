"""`cf-tasks experiment mechanism`: the recorded quantities of one step against a direct
computation (numpy, float64, the paper's equations written out), the summary across seeds, and
bad arguments."""

import csv
import math

import numpy as np
import pytest

from cf_tasks.cli import main
from cf_tasks.experiments import mechanism as mech

SEEDS = (5, 6)
STEPS = 3
CHECK_STEP = 2  # the step replayed: after two updates


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("mechanism")
    assert main(["experiment", "mechanism", "--output_path", str(out), "--seeds", ",".join(map(str, SEEDS)),
                 "--steps", str(STEPS), "--no_plots"]) == 0
    return out


@pytest.fixture(scope="module")
def study():
    """The second seed's data and pretrained weights, shared: ``finetune`` copies the weights."""
    return mech.Study(mech.MechanismConfig(steps=STEPS), SEEDS[1])


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _direct(phi, w_kq, w_v, tokens, targets):
    """Equation 4 and 5 of the paper, one sequence at a time: attention of r on each position,
    logits phi(t)^T W_V sum_y sigma_y phi(y), cross-entropy on the target."""
    attn, losses, logits_all = [], [], []
    for seq, target in zip(tokens, targets):
        emb = phi[seq]                                    # (L, d)
        scores = np.array([emb[i] @ w_kq @ emb[-1] for i in range(len(seq))])
        sigma = np.exp(scores - scores.max())
        sigma /= sigma.sum()
        logits = phi @ (w_v @ (sigma @ emb))
        lse = logits.max() + math.log(np.exp(logits - logits.max()).sum())
        attn.append(sigma)
        losses.append(lse - logits[target])
        logits_all.append(logits)
    return np.array(attn), np.array(losses), np.array(logits_all)


@pytest.mark.parametrize("arm", mech.ARMS)
def test_a_recorded_step_equals_a_direct_computation(study_dir, study, arm):
    seed = study.seed
    seen = {}
    mech.finetune(study, arm, record=lambda step, kq, v, batch: seen.setdefault(step, (kq.numpy(), v.numpy())))
    w_kq, w_v = (w.astype(np.float64) for w in seen[CHECK_STEP])
    if arm == "qk_only":
        assert np.array_equal(seen[CHECK_STEP][1], study.w_v0.numpy())  # W_V frozen
    else:
        assert not np.array_equal(seen[CHECK_STEP][1], study.w_v0.numpy())
    phi = study.geo.phi.numpy().astype(np.float64)

    probe_tokens, probe_ctx = (t.numpy() for t in study.probe)
    attn, _, logits = _direct(phi, w_kq, w_v, probe_tokens, probe_ctx)
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    rows = np.arange(len(probe_ctx))
    memory = study.probe_memory.numpy()
    expected = {
        "attn_context": attn[:, 0].mean(),
        "attn_subject": attn[:, 1].mean(),
        "cf_acc": (logits.argmax(1) == probe_ctx).mean(),
        "cf_context_prob": (probs[rows, probe_ctx] / (probs[rows, probe_ctx] + probs[rows, memory])).mean(),
        "loss_c": _direct(phi, w_kq, w_v, *(t.numpy() for t in study.sets["c"]))[1].mean(),
        "loss_cs": _direct(phi, w_kq, w_v, *(t.numpy() for t in study.sets["cs"]))[1].mean(),
    }
    # Proposition 1's quantities: theta^T (-grad_{W_KQ} L) phi(r) is minus the derivative of the
    # fine-tuning set's loss along W_KQ + eps * theta phi(r)^T (central difference).
    train = [t.numpy() for t in study.train_set(arm)]
    r_dir = phi[study.geo.relation]
    for name, axis in (("kq_push_context", study.geo.theta_c), ("kq_push_subject", study.geo.theta_s)):
        bump = np.zeros_like(w_kq)
        bump[axis] = r_dir
        eps = 1e-4
        up = _direct(phi, w_kq + eps * bump, w_v, *train)[1].mean()
        down = _direct(phi, w_kq - eps * bump, w_v, *train)[1].mean()
        expected[name] = -(up - down) / (2 * eps)

    recorded = next(r for r in _rows(study_dir / f"{arm}.csv") if r["seed"] == str(seed) and r["step"] == str(CHECK_STEP))
    for q, value in expected.items():
        assert float(recorded[q]) == pytest.approx(value, rel=2e-3, abs=2e-4), q


def test_the_geometry_is_the_papers(study_dir, study):
    """Unit embeddings; subjects share theta_S, answers theta_C (inner product 1/2 within a
    group, 0 across); phi(r) orthogonal to all; attention starts equal on context and subject."""
    geo = study.geo
    gram = (geo.phi @ geo.phi.T).numpy()
    s, a = slice(0, geo.n_subjects), slice(geo.n_subjects, geo.n_subjects + geo.n_answers)
    assert np.allclose(np.diag(gram), 1)
    assert np.allclose(gram[s, s][~np.eye(geo.n_subjects, dtype=bool)], 0.5)
    assert np.allclose(gram[a, a][~np.eye(geo.n_answers, dtype=bool)], 0.5)
    assert np.allclose(gram[s, a], 0) and np.allclose(gram[geo.relation, :-1], 0)
    first = next(r for r in _rows(study_dir / "mix.csv") if r["step"] == "0")
    assert abs(float(first["attn_context"]) - float(first["attn_subject"])) < 0.01


def test_the_summary_is_the_spread_of_the_arm_csvs(study_dir):
    rows = _rows(study_dir / "counterfactual.csv")
    assert {(r["seed"], r["step"]) for r in rows} == {(str(s), str(t)) for s in SEEDS for t in range(STEPS + 1)}
    values = [float(r["loss_c"]) for r in rows if r["step"] == "1"]
    summary = next(r for r in _rows(study_dir / "summary.csv")
                   if (r["arm"], r["step"], r["quantity"]) == ("counterfactual", "1", "loss_c"))
    assert int(summary["n_seeds"]) == len(SEEDS)
    assert float(summary["mean"]) == pytest.approx(np.mean(values), rel=1e-4)
    assert float(summary["std"]) == pytest.approx(np.std(values, ddof=1), rel=1e-3, abs=1e-6)
    assert float(summary["max"]) == pytest.approx(max(values), rel=1e-5)


def test_the_same_seed_gives_the_same_rows(tmp_path, study_dir):
    assert main(["experiment", "mechanism", "--output_path", str(tmp_path), "--seeds", str(SEEDS[0]),
                 "--steps", str(STEPS), "--no_plots"]) == 0
    again = _rows(tmp_path / "qk_only.csv")
    first = [r for r in _rows(study_dir / "qk_only.csv") if r["seed"] == str(SEEDS[0])]
    assert again == first


@pytest.mark.parametrize("extra, needle", [
    (["--seeds", "one,two"], "--seeds"),
    (["--seeds", "1,1"], "--seeds"),
    (["--steps", "0"], "--steps"),
])
def test_bad_arguments_are_one_line_errors(tmp_path, capsys, extra, needle):
    assert main(["experiment", "mechanism", "--output_path", str(tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cf-tasks: error:") and needle in err and "\n" not in err
    assert not (tmp_path / "o").exists()
