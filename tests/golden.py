"""Golden sha256 of every dataset's JSON Lines bytes, per (dataset, builder version, seed).

``tests/test_versions.py`` rebuilds each dataset for ``SEEDS`` and compares its bytes with the
recorded digest of the builder's current ``VERSION``: a change of bytes without a version bump
fails there, naming the dataset and what to bump. After a bump, record the new version's digests:

    python tests/golden.py

Recording only adds missing (dataset, version, seed) entries; it never overwrites one, so a
change cannot be recorded over an old version's digest. Old versions' entries stay as history.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GOLDEN_PATH = Path(__file__).resolve().parent / "data" / "dataset_sha256.json"
SEEDS = (0, 1, 1234)


def digest(name: str, seed: int) -> str:
    from dataset_builders import build
    from dataset_builders.serialize import sha256, to_jsonl_bytes

    return sha256(to_jsonl_bytes(build(name, seed)))


def load_golden() -> dict:
    return json.loads(GOLDEN_PATH.read_text(encoding="utf-8")) if GOLDEN_PATH.exists() else {}


def record() -> list[str]:
    """Add the digests the current builders lack; returns one line per added entry."""
    from dataset_builders import DATASETS, version

    golden = load_golden()
    added = []
    for name in DATASETS:
        per_seed = golden.setdefault(name, {}).setdefault(str(version(name)), {})
        for seed in SEEDS:
            if str(seed) not in per_seed:
                per_seed[str(seed)] = digest(name, seed)
                added.append(f"{name} v{version(name)} seed {seed}: {per_seed[str(seed)]}")
    GOLDEN_PATH.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return added


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    lines = record()
    print("\n".join(lines) if lines else "nothing to add: every (dataset, version, seed) is recorded")
