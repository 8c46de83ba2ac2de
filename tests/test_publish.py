"""`cf-tasks publish`: the Hub layout and card, card merging, the (mocked) upload, errors, the token,
and reading a published copy back in place of the in-process build. Nothing here reaches the Hub:
uploads go to a recording fake of ``HfApi`` and "published" copies are local dry-run folders.
"""

import functools
import importlib
import logging
from collections import Counter
from pathlib import Path

import datasets
import huggingface_hub
import pandas as pd
import pytest
import yaml
from huggingface_hub import DatasetCard, HfApi
from huggingface_hub.errors import HfHubHTTPError, RemoteEntryNotFoundError
from packaging.version import Version

# The HTTP client whose responses huggingface_hub's errors carry: httpx2 from hub 2.0, httpx before.
http_client = importlib.import_module("httpx2" if Version(huggingface_hub.__version__).major >= 2 else "httpx")

from cf_tasks import hub
from cf_tasks.cli import main
from cf_tasks.files import TMP_MARK
from cf_tasks.tasks import built_dataset
from dataset_builders import DATASETS, DEFAULT_SEED, validate
from dataset_builders.schema import FIELD_NAMES
from dataset_builders.validate import rules_for_dataset

REPO = "my-org/cf-tasks-test"
TOKEN = "hf_SeCrEtTokenThatMustNeverBePrinted123"
SEED = 7


_cached_build = functools.lru_cache(maxsize=None)(validate.build_validated)


@pytest.fixture(autouse=True)
def _fast_and_private(tmp_path_factory, monkeypatch):
    # load_dataset caches what it prepares; keep that out of the user's cache.
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_datasets_cache"))
    # Each publish builds and validates every dataset (seconds); the builds are pure, so share them.
    monkeypatch.setattr(validate, "build_validated", _cached_build)


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    """One dry-run export with ``SEED``, shared by the read-only tests."""
    out = tmp_path_factory.mktemp("export")
    assert _dry_run(out, "--seed", str(SEED)) == 0
    return out


def _dry_run(out: Path, *args: str) -> int:
    return main(["publish", "--repo_id", REPO, "--dry_run", "--out", str(out), "--quiet", *args])


def _card_metadata(path: Path) -> dict:
    return DatasetCard.load(path).data.to_dict()


# --------------------------------------------------------------------------- layout and card


@pytest.mark.slow
def test_dry_run_loads_back_row_for_row(export_dir):
    for name in DATASETS:
        loaded = datasets.load_dataset(str(export_dir), name)
        assert list(loaded) == ["test"]
        expected = built_dataset(name, SEED)
        assert loaded["test"].features == expected.features
        assert loaded["test"].to_list() == expected.to_list(), name


def test_default_config_is_cf_bio(export_dir):
    loaded = datasets.load_dataset(str(export_dir), split="test")
    assert loaded.to_list() == built_dataset(hub.DEFAULT_CONFIG, SEED).to_list()


def test_card_parses_and_its_configs_match_the_files(export_dir):
    meta = _card_metadata(export_dir / "README.md")
    configs = meta["configs"]
    assert [c["config_name"] for c in configs] == sorted(DATASETS)  # datasets writes them sorted by name
    assert [c["config_name"] for c in configs if c.get("default")] == ["cf_bio"]
    listed = set()
    for c in configs:
        (entry,) = c["data_files"]
        assert entry["split"] == "test"
        assert (export_dir / entry["path"]).is_file()
        listed.add(entry["path"])
    on_disk = {p.relative_to(export_dir).as_posix() for p in export_dir.rglob("*.parquet")}
    assert on_disk == listed
    infos = {i["config_name"]: i for i in meta["dataset_info"]}
    assert set(infos) == set(DATASETS)
    for name, info in infos.items():
        assert [f["name"] for f in info["features"]] == list(FIELD_NAMES)
        assert info["splits"][0]["num_examples"] == len(built_dataset(name, SEED))
    assert meta["license"] == "mit" and meta["pretty_name"] and meta["task_categories"]
    total = sum(info["splits"][0]["num_examples"] for info in infos.values())
    assert meta["size_categories"] == [hub.size_category(total)]
    assert hub.size_category(999) == "n<1K" and hub.size_category(1000) == "1K<n<10K"


def test_card_configs_and_infos_read_back_through_datasets_as_written(tmp_path):
    from datasets.info import DatasetInfosDict
    from datasets.utils.metadata import MetadataConfigs

    exp = hub.export(tmp_path, SEED, REPO)
    data = DatasetCard.load(tmp_path / "README.md").data
    assert MetadataConfigs.from_dataset_card_data(data) == hub.metadata_configs(exp)
    assert MetadataConfigs.from_dataset_card_data(data).get_default_config_name() == hub.DEFAULT_CONFIG

    def described(infos):
        return {n: (i.features, i.splits, i.download_size, i.dataset_size) for n, i in infos.items()}

    assert described(DatasetInfosDict.from_dataset_card_data(data)) == described(hub.dataset_infos(exp))


def test_card_body_describes_build_counts_seed_and_citation(export_dir):
    card = DatasetCard.load(export_dir / "README.md")
    body = card.text
    assert body.count(hub.CARD_BEGIN) == 1 and body.count(hub.CARD_END) == 1
    for name in DATASETS:
        assert f"### {name}" in body
        for relation, count in Counter(built_dataset(name, SEED)["relation"]).items():
            assert f"| `{relation}` | {count} |" in body
        section = body.split(f"### {name}\n", 1)[1].split("\n### ", 1)[0]
        for rule, (description, _) in rules_for_dataset(name).items():
            assert f"- `{rule}`: {description}" in section  # each config lists the rules its build keeps
    for field in FIELD_NAMES:
        assert f"| `{field}` |" in body
    assert f"Seed: **{SEED}**" in body
    from cf_tasks.scoring import SCORER_VERSION

    assert f"scorer version **{SCORER_VERSION}**" in body
    assert f"cf-tasks publish --repo_id {REPO} --seed {SEED}" in body
    assert "@inproceedings{goyal2025contextparametric" in body
    assert "Context-Parametric Inversion: Why Instruction Finetuning May Not Actually Improve Context Reliance" in body
    assert "Goyal, Sachin and Baek, Christina and Kolter, J. Zico and Raghunathan, Aditi" in body


@pytest.mark.slow
def test_a_builder_can_add_its_own_citation(monkeypatch, tmp_path):
    import dataset_builders

    extra = "@misc{other2024, title = {Another source}}"
    monkeypatch.setattr(dataset_builders.builder("cf_quotes"), "CITATION", extra, raising=False)
    assert _dry_run(tmp_path) == 0
    body = DatasetCard.load(tmp_path / "README.md").text
    assert body.count("@inproceedings{goyal2025contextparametric") == 1 and extra in body


def test_every_field_is_documented():
    assert set(hub.FIELD_DOCS) == set(FIELD_NAMES)


def test_export_is_deterministic(export_dir, tmp_path):
    assert _dry_run(tmp_path, "--seed", str(SEED)) == 0
    for path in export_dir.rglob("*"):
        if path.is_file():
            assert (tmp_path / path.relative_to(export_dir)).read_bytes() == path.read_bytes(), path


def test_dry_run_summary_names_configs(tmp_path, capsys):
    assert main(["publish", "--repo_id", REPO, "--dry_run", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name in DATASETS:
        assert name in out
    assert f"with seed {DEFAULT_SEED} to {tmp_path}" in out
    assert not list(tmp_path.rglob(f"*{TMP_MARK}"))


# --------------------------------------------------------------------------- merging


USER_CARD = f"""---
my_custom_field: keep me
license: apache-2.0
tags:
- my-tag
configs:
- config_name: my_extra
  data_files:
  - split: test
    path: extra/test.parquet
- config_name: cf_capitals
  data_files: stale/*.parquet
dataset_info:
- config_name: my_extra
  features:
  - name: x
    dtype: string
- config_name: cf_capitals
  features:
  - name: stale
    dtype: string
---

# My benchmark

Intro written by the user.

{hub.CARD_BEGIN}
old generated text
{hub.CARD_END}

## Notes kept by the user
"""


def test_reexport_over_a_custom_card_keeps_user_fields(tmp_path):
    (tmp_path / "extra").mkdir()
    # Same format as ours: a no-script Hub dataset reads every config with one builder.
    pd.DataFrame({"x": ["hello"]}).to_parquet(tmp_path / "extra" / "test.parquet")
    (tmp_path / "README.md").write_text(USER_CARD)
    assert _dry_run(tmp_path) == 0
    text = (tmp_path / "README.md").read_text()
    meta = _card_metadata(tmp_path / "README.md")
    assert meta["my_custom_field"] == "keep me"
    assert meta["license"] == "mit"  # ours is updated
    assert meta["tags"][0] == "my-tag" and "knowledge-conflict" in meta["tags"]
    configs = {c["config_name"]: c for c in meta["configs"]}
    assert set(configs) == {"my_extra", *DATASETS}
    assert configs["my_extra"]["data_files"] == [{"split": "test", "path": "extra/test.parquet"}]
    assert configs["cf_capitals"]["data_files"] == [{"split": "test", "path": hub.data_path("cf_capitals")}]
    infos = {i["config_name"]: i for i in meta["dataset_info"]}
    assert infos["my_extra"]["features"] == [{"name": "x", "dtype": "string"}]
    assert [f["name"] for f in infos["cf_capitals"]["features"]] == list(FIELD_NAMES)
    # The user's key order and body survive; only the marked section is regenerated.
    assert text.index("my_custom_field") < text.index("license")
    assert "Intro written by the user." in text and "## Notes kept by the user" in text
    assert "old generated text" not in text and text.count(hub.CARD_BEGIN) == 1
    # Every config, ours and theirs, still loads.
    assert datasets.load_dataset(str(tmp_path), "my_extra", split="test")["x"] == ["hello"]
    assert datasets.load_dataset(str(tmp_path), "cf_capitals", split="test").to_list() == \
        built_dataset("cf_capitals", DEFAULT_SEED).to_list()
    # A second export changes nothing (merging is idempotent).
    assert _dry_run(tmp_path) == 0
    assert (tmp_path / "README.md").read_text() == text


def test_a_users_default_config_stays_the_only_default():
    ours = {"configs": [{"config_name": "cf_bio", "data_files": "a", "default": True}]}
    old = {"configs": [{"config_name": "mine", "data_files": "b", "default": True}]}
    merged = hub.merge_metadata(old, ours)
    assert [c["config_name"] for c in merged["configs"] if c.get("default")] == ["mine"]


def test_a_users_config_with_features_is_kept_as_written():
    # datasets reads a config's `features` into a Features object, which YAML cannot write back.
    mine = {"config_name": "mine", "data_files": "b.csv", "features": [{"name": "x", "dtype": "string"}]}
    existing = yaml.safe_dump({"configs": [mine]}, sort_keys=False)
    ours = hub.card_text(huggingface_hub.DatasetCardData(configs=[{"config_name": "cf_bio", "data_files": "a"}]), "body")
    merged = hub.merge_card(f"---\n{existing}---\n", ours)
    configs = yaml.safe_load(merged.split("---\n")[1])["configs"]
    assert configs == [{"config_name": "cf_bio", "data_files": "a"}, mine]


@pytest.mark.parametrize("field, block", [
    ("configs", "configs:\n- data_files: a.csv\n"),  # no config_name
    ("dataset_info", "dataset_info:\n- features:\n  - name: x\n    dtype: string\n- config_name: b\n"),
])
def test_configs_or_infos_that_datasets_cannot_read_are_one_line_errors(tmp_path, capsys, field, block):
    (tmp_path / "README.md").write_text(f"---\n{block}---\nbody\n")
    assert _dry_run(tmp_path) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"`{field}`" in err and err.endswith("fix it and publish again")
    assert not (tmp_path / "data").exists()


def test_a_metadata_key_that_is_not_text_is_one_line_error(tmp_path, capsys):
    (tmp_path / "README.md").write_text("---\nlicense: mit\n2024: a year\n---\nbody\n")
    assert _dry_run(tmp_path) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "metadata key that is not text (2024)" in err


def test_card_without_markers_keeps_its_text_and_gains_ours():
    merged = hub.merge_body("# Hand-written card\n", f"{hub.CARD_BEGIN}\nours\n{hub.CARD_END}\n")
    assert merged.startswith("# Hand-written card\n") and merged.rstrip().endswith(hub.CARD_END)


def test_malformed_existing_card_is_one_line_error_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "README.md").write_text("---\nconfigs: [oops\n---\nbody\n")
    assert _dry_run(tmp_path) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("cf-tasks: error: the existing README.md")
    assert not (tmp_path / "data").exists()


def test_configs_field_that_is_not_a_list_is_refused(tmp_path, capsys):
    (tmp_path / "README.md").write_text("---\nconfigs: just-a-string\n---\nbody\n")
    assert _dry_run(tmp_path) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "`configs`" in err


# --------------------------------------------------------------------------- input errors


@pytest.mark.parametrize("repo_id", ["no-slash", "a/b/c", "/name", "org/", "org/bad name", "org/--x"])
def test_malformed_repo_id_is_one_line_error(repo_id, tmp_path, capsys):
    assert main(["publish", "--repo_id", repo_id, "--dry_run", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith(f"cf-tasks: error: invalid repo id {repo_id!r}") and "ORG/NAME" in err
    assert not any(tmp_path.iterdir())


def test_dry_run_needs_out(capsys):
    assert main(["publish", "--repo_id", REPO, "--dry_run"]) == 2
    assert "--dry_run needs --out" in capsys.readouterr().err


def test_missing_token_is_one_line_error_before_any_work(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    calls = []
    monkeypatch.setattr(hub, "export", lambda *a, **k: calls.append("export"))
    monkeypatch.setattr(HfApi, "create_repo", lambda *a, **k: calls.append("create_repo"))
    assert main(["publish", "--repo_id", REPO, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no Hugging Face token" in err and "HF_TOKEN" in err
    assert calls == []


# --------------------------------------------------------------------------- upload (mocked Hub)


def _http_error(status: int, message: str, cls=HfHubHTTPError):
    request = http_client.Request("POST", f"https://huggingface.co/api/datasets/{REPO}/commit/main")
    return cls(message, response=http_client.Response(status, request=request))


class FakeHub:
    """Records what ``HfApi`` is asked to do; ``remote_card`` is the card the repo already has."""

    def __init__(self, monkeypatch, tmp_path, remote_card=None, refuse=None):
        self.calls, self.operations, self.tokens = [], [], []
        self.remote_card, self.refuse, self.dir = remote_card, refuse, tmp_path
        fake = self

        def init(api, *args, token=None, **kwargs):
            fake.tokens.append(token)
            api.token = token

        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # the fake is the network
        monkeypatch.setattr(HfApi, "__init__", init)
        monkeypatch.setattr(HfApi, "create_repo", self.create_repo)
        monkeypatch.setattr(HfApi, "create_branch", self.create_branch)
        monkeypatch.setattr(HfApi, "dataset_info", self.dataset_info)
        monkeypatch.setattr(HfApi, "hf_hub_download", self.hf_hub_download)
        monkeypatch.setattr(HfApi, "create_commit", self.create_commit)

    def _call(self, name, **kwargs):
        self.calls.append((name, kwargs))
        if self.refuse and self.refuse[0] == name:
            raise self.refuse[1]

    def create_repo(self, repo_id, **kwargs):
        self._call("create_repo", repo_id=repo_id, **kwargs)

    def create_branch(self, repo_id, **kwargs):
        self._call("create_branch", repo_id=repo_id, **kwargs)

    def dataset_info(self, repo_id, **kwargs):
        self._call("dataset_info", repo_id=repo_id, **kwargs)
        return type("Info", (), {"sha": "a" * 40})()

    def hf_hub_download(self, repo_id, filename, **kwargs):
        self._call("hf_hub_download", repo_id=repo_id, filename=filename, **kwargs)
        if self.remote_card is None:
            raise _http_error(404, "Entry not found", RemoteEntryNotFoundError)
        path = self.dir / "remote_README.md"
        path.write_text(self.remote_card)
        return str(path)

    def create_commit(self, repo_id, operations, **kwargs):
        self._call("create_commit", repo_id=repo_id, **kwargs)
        for op in operations:
            data = Path(op.path_or_fileobj).read_bytes() if isinstance(op.path_or_fileobj, str) else op.path_or_fileobj
            self.operations.append((op.path_in_repo, data))
        return type("CommitInfo", (), {"oid": "b" * 40, "commit_url": "https://example/commit"})()


@pytest.fixture
def token_env(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    return TOKEN


def _assert_no_token(capsys, caplog):
    captured = capsys.readouterr()
    assert TOKEN not in captured.out and TOKEN not in captured.err
    for record in caplog.records:
        assert TOKEN not in record.getMessage()
    assert TOKEN not in caplog.text
    return captured


def test_upload_is_one_commit_with_every_file(token_env, monkeypatch, tmp_path, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    fake = FakeHub(monkeypatch, tmp_path)
    assert main(["publish", "--repo_id", REPO, "--private", "--seed", str(SEED)]) == 0
    assert fake.tokens == [TOKEN]
    names = [c[0] for c in fake.calls]
    assert names == ["create_repo", "dataset_info", "hf_hub_download", "create_commit"]
    create = dict(fake.calls[0][1])
    assert create["repo_type"] == "dataset" and create["private"] is True and create["exist_ok"] is True
    commit = dict(fake.calls[-1][1])
    assert commit["repo_type"] == "dataset" and commit["revision"] == "main" and commit["parent_commit"] == "a" * 40
    paths = [p for p, _ in fake.operations]
    assert paths == ["README.md", *(hub.data_path(n) for n in DATASETS)]
    card = DatasetCard(dict(fake.operations)["README.md"].decode())
    assert [c["config_name"] for c in card.data.to_dict()["configs"]] == sorted(DATASETS)
    out = _assert_no_token(capsys, caplog).out
    assert "b" * 40 in out and f'"hub_repo": "{REPO}"' in out


def test_upload_merges_the_remote_card(token_env, monkeypatch, tmp_path, capsys, caplog):
    fake = FakeHub(monkeypatch, tmp_path, remote_card=USER_CARD)
    assert main(["publish", "--repo_id", REPO, "--revision", "v-branch", "--quiet"]) == 0
    assert ("create_branch", {"repo_id": REPO, "branch": "v-branch", "repo_type": "dataset", "exist_ok": True}) \
        in fake.calls
    meta = DatasetCard(dict(fake.operations)["README.md"].decode()).data.to_dict()
    assert meta["my_custom_field"] == "keep me"
    assert {c["config_name"] for c in meta["configs"]} == {"my_extra", *DATASETS}
    _assert_no_token(capsys, caplog)


@pytest.mark.parametrize("step", ["create_repo", "hf_hub_download", "create_commit"])
def test_refused_upload_is_one_line_error_without_the_token(step, token_env, monkeypatch, tmp_path, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    # A server message that echoes the token must not leak it either.
    error = _http_error(403, f"403 Forbidden: token {TOKEN} cannot write to my-org\nrequest id: 1")
    fake = FakeHub(monkeypatch, tmp_path, refuse=(step, error))
    assert main(["publish", "--repo_id", REPO]) == 2
    err = _assert_no_token(capsys, caplog).err.strip().splitlines()[-1]
    assert err.startswith("cf-tasks: error: could not ") and "HTTP 403" in err and "write access" in err
    if step != "create_commit":
        assert "create_commit" not in [c[0] for c in fake.calls]


def test_offline_hub_is_one_line_error(token_env, monkeypatch, tmp_path, capsys, caplog):
    FakeHub(monkeypatch, tmp_path, refuse=("create_repo", huggingface_hub.errors.OfflineModeIsEnabled("offline")))
    assert main(["publish", "--repo_id", REPO, "--quiet"]) == 2
    err = _assert_no_token(capsys, caplog).err.strip()
    assert err.count("\n") == 0 and "HF_HUB_OFFLINE" in err


def test_hub_switched_off_is_said_before_any_dataset_is_built(token_env, monkeypatch, capsys, caplog):
    from unittest import mock

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    export = mock.create_autospec(hub.export)
    monkeypatch.setattr(hub, "export", export)
    assert main(["publish", "--repo-id", REPO]) == 2
    err = _assert_no_token(capsys, caplog).err.strip()
    assert err == ("cf-tasks: error: the Hugging Face Hub is switched off (HF_HUB_OFFLINE is set); unset HF_HUB_OFFLINE "
                   "to publish, or export with --dry-run --out DIR")
    export.assert_not_called()


def test_redact_hides_token_shaped_text():
    assert hub.redact(f"x {TOKEN} y") == "x *** y"
    assert hub.redact("secret-without-prefix", "secret-without-prefix") == "***"


# --------------------------------------------------------------------------- loading a published copy


def test_published_copy_equals_in_process_build(export_dir):
    for name in DATASETS:
        published = hub.load_published(str(export_dir), name, None)
        built = built_dataset(name, SEED)
        assert isinstance(published, datasets.Dataset)
        assert published.features == built.features
        assert published.to_list() == built.to_list(), name


def test_local_folder_ignores_revision(export_dir):
    a = hub.load_published(str(export_dir), "cf_quotes", "main")
    assert a.to_list() == built_dataset("cf_quotes", SEED).to_list()


@pytest.mark.parametrize("revision", [None, "", "main"])
def test_hub_repo_needs_a_pinned_revision(revision):
    with pytest.raises(hub.PublishError) as info:
        hub.load_published(REPO, "cf_bio", revision)
    message = str(info.value)
    assert "\n" not in message and "revision" in message and '"revision": "<commit sha>"' in message


def test_hub_repo_that_is_no_folder_and_no_repo_id_is_refused(tmp_path):
    with pytest.raises(hub.PublishError, match="neither a folder nor a Hub repo id"):
        hub.load_published(str(tmp_path / "missing" / "export"), "cf_bio", None)


def test_branch_names_are_refused_and_tags_accepted(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    ref = lambda name, kind: type("Ref", (), {"name": name, "ref": f"refs/{kind}/{name}"})()  # noqa: E731
    refs = type("Refs", (), {"branches": [ref("main", "heads"), ref("dev", "heads")], "tags": [ref("v1", "tags")]})()
    monkeypatch.setattr(HfApi, "list_repo_refs", lambda self, *a, **k: refs)
    hub.repo_refs.cache_clear()
    hub.check_pinned(REPO, "v1")
    hub.check_pinned(REPO, "0123456789abcdef0123456789abcdef01234567")
    with pytest.raises(hub.PublishError, match="is a branch, which can move"):
        hub.check_pinned(REPO, "dev")
    with pytest.raises(hub.PublishError, match="is not a tag"):
        hub.check_pinned(REPO, "nope")


def test_hub_repo_loads_with_the_pinned_revision(monkeypatch, export_dir):
    seen = {}
    real = datasets.load_dataset

    def fake_load(path, name, revision=None, split=None):
        seen.update(path=path, name=name, revision=revision, split=split)
        return real(str(export_dir), name, split=split)

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    sha = "c" * 40
    ds = hub.load_published(REPO, "cf_capitals", sha)
    assert seen == {"path": REPO, "name": "cf_capitals", "revision": sha, "split": "test"}
    assert ds.to_list() == built_dataset("cf_capitals", SEED).to_list()


def test_lm_eval_reads_the_same_docs_from_a_published_copy(export_dir, monkeypatch):
    from cf_tasks.registry import task_manager

    calls = []
    real = hub.load_published
    monkeypatch.setattr(hub, "load_published", lambda *a: calls.append(a) or real(*a))
    tasks = ["cf_capitals", "cf_quotes_mc"]
    published = task_manager(metadata={"hub_repo": str(export_dir)}).load(tasks)["tasks"]
    in_process = task_manager(metadata={"seed": SEED}).load(tasks)["tasks"]
    assert sorted(c[1] for c in calls) == ["cf_capitals", "cf_quotes"]
    for name in tasks:
        a, b = list(published[name].test_docs()), list(in_process[name].test_docs())
        assert a == b and len(a) > 100, name
