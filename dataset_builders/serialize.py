"""Writing datasets to disk: JSON Lines or Parquet, atomically (``cf_tasks.files.atomic_write``), plus a
manifest with checksums."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from cf_tasks.files import atomic_write

from .schema import FIELD_NAMES, Item

FORMATS = ("jsonl", "parquet")


def to_jsonl_bytes(items: list[Item]) -> bytes:
    lines = (json.dumps(item.to_dict(), ensure_ascii=False) for item in items)
    return "".join(line + "\n" for line in lines).encode("utf-8")


def to_parquet_bytes(items: list[Item]) -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([i.to_dict() for i in items], schema=arrow_schema())
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def arrow_schema():
    import pyarrow as pa

    kinds = {"str": pa.string(), "int": pa.int64(), "bool": pa.bool_(), "list[str]": pa.list_(pa.string())}
    from .schema import FIELDS

    return pa.schema([(name, kinds[FIELDS[name]]) for name in FIELD_NAMES])


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_dataset(items: list[Item], out_dir: Path, name: str, fmt: str) -> tuple[Path, bytes]:
    data = to_jsonl_bytes(items) if fmt == "jsonl" else to_parquet_bytes(items)
    path = Path(out_dir) / f"{name}.{fmt}"
    atomic_write(path, data)
    return path, data


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


MANIFEST_KEYS = {"datasets": "datasets (cf-tasks build)", "kinds": "training points (cf-tasks build --for_training)"}


def check_manifest_owner(out_dir: Path, key: str) -> None:
    """``ValueError`` (one line) when ``out_dir/manifest.json`` is not a manifest of the same kind of
    build (``key``: ``datasets`` or ``kinds``): writing there would overwrite another build's
    record of its files."""
    path = Path(out_dir) / "manifest.json"
    if not path.is_file():
        return
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        manifest = None
    if isinstance(manifest, dict) and key in manifest:
        return
    other = next((what for k, what in MANIFEST_KEYS.items() if isinstance(manifest, dict) and k in manifest),
                 "files that cf-tasks build did not write")
    raise ValueError(f"--output_path {out_dir}: its manifest.json records {other}, which this build would "
                     "overwrite; pass another --output_path")


def prior_entries(out_dir: Path, key: str, settings: dict, rebuilt) -> dict:
    """The entries (``key``: ``datasets`` or ``kinds``) of an earlier build into ``out_dir`` whose
    files are still there and which this build (of ``rebuilt``) does not write again: kept in this
    build's manifest beside its own. An earlier build made with other ``settings`` is replaced
    whole, or, when it holds files this build would not replace (which would sit beside this
    build's, of other settings, under one manifest), refused: ``ValueError``, one line. Call after
    ``check_manifest_owner``."""
    path = Path(out_dir) / "manifest.json"
    if not path.is_file():
        return {}
    manifest = json.loads(path.read_text(encoding="utf-8"))
    entries = manifest.get(key) if isinstance(manifest.get(key), dict) else {}
    kept = {n: e for n, e in entries.items()
            if n not in rebuilt and isinstance(e, dict) and (Path(out_dir) / str(e.get("file"))).is_file()}
    differ = [name for name, value in settings.items() if manifest.get(name) != value]
    if differ and kept:
        name = differ[0]
        what = "other dataset versions" if name == "versions" else f"{name} {manifest.get(name)!r}"
        raise ValueError(f"--output_path {out_dir}: it holds {', '.join(sorted(kept))} of a build with {what}, "
                         "which would sit beside this build's files under one manifest; pass another --output_path, "
                         f"rebuild {'them' if len(kept) > 1 else 'it'} too, or build with the same settings")
    return {} if differ else kept
