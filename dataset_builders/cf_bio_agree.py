"""CF_Bio_Agree: the agreeing twin of ``cf_bio`` (issue 15, item 4).

The same items (ids, questions, answers) and the same biographies, sentence by sentence, told with
the true name or value: the person's own name where ``cf_bio`` swapped in another famous person's,
the true birth year, birth city or nationality where it changed one ("an Italian painter", not "a
Spanish painter"). Context and memory agree, a control for reading. ``counterfactual_answer`` keeps
the value the twin replaced; no form of it (nor a fragment of a substitute's name) is left in the
passage.
"""

from __future__ import annotations

from . import cf_bio
from .common import agree_twin
from .schema import Item

NAME = "cf_bio_agree"
VERSION = 1
TWIN_OF = cf_bio.NAME
EXTRA_RULES = cf_bio.AGREE_RULES


def build(seed: int) -> list[Item]:
    return [agree_twin(item, sentences, NAME, VERSION) for item, sentences in cf_bio.build_pairs(seed)]
