"""Exporting the datasets in the Hub layout: ``data/<config>/test-00000-of-00001.parquet`` per
dataset (the split the task YAMLs read) and a ``README.md`` card whose YAML ``configs`` maps each
config to its file (merged into the card already in the folder, if any)."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

from ..files import atomic_write
from .card import merge_card, render_card
from .repo import CARD_FILE, ConfigExport, Export, PublishError, data_path


def export(out: Path, seed: int, repo_id: str, existing_card: str | None = None,
           progress: bool = False) -> Export:
    """Build every dataset with ``seed`` and write the Hub layout to ``out``.

    ``existing_card`` is the text of a card to merge into; ``None`` merges with ``out/README.md``
    when the folder already has one. Every file is written atomically.
    """
    import pyarrow.parquet as pq
    from tqdm import tqdm

    import dataset_builders
    from dataset_builders.serialize import to_parquet_bytes
    from dataset_builders.validate import ValidationError, build_validated

    out = Path(out)
    if existing_card is None and (out / CARD_FILE).is_file():
        existing_card = (out / CARD_FILE).read_text(encoding="utf-8")
    result = Export(out=out, seed=seed)
    built = {}
    for name in tqdm(dataset_builders.DATASETS, desc="building", unit="dataset", disable=not progress):
        try:
            built[name] = build_validated(name, seed)
        except ValidationError as err:
            first = str(err).splitlines()[0]
            raise PublishError(f"{first} (see `cf-tasks build --dataset {name}`); "
                               "fix the fact table or builder and publish again") from None
    blobs = {}
    for name, items in built.items():
        blob = to_parquet_bytes(items)
        blobs[name] = blob
        result.configs[name] = ConfigExport(
            name=name, path=data_path(name), count=len(items), version=dataset_builders.version(name),
            relations=dict(sorted(Counter(i.relation for i in items).items())),
            num_bytes=pq.read_table(io.BytesIO(blob)).nbytes, download_size=len(blob),
        )
    # Merge before writing anything, so a malformed existing card leaves the folder untouched.
    card = merge_card(existing_card, render_card(result, repo_id))
    for name, blob in blobs.items():
        path = out / result.configs[name].path
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, blob)
    atomic_write(out / CARD_FILE, card.encode("utf-8"))
    return result
