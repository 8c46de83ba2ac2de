"""The item schema every counterfactual dataset shares, and the helpers builders use to fill it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from cf_tasks.text import contains

POSITIONS = ("beginning", "middle", "end")


@dataclass(frozen=True)
class Item:
    """One knowledge-conflict item: a context that contradicts a fact, and a question about it."""

    id: str
    dataset: str
    relation: str
    subject: str
    context: str
    question: str
    counterfactual_answer: str
    parametric_answer: str
    version: int
    seed: int
    counterfactual_aliases: list[str] = field(default_factory=list)
    parametric_aliases: list[str] = field(default_factory=list)
    answer_position: str = "beginning"
    mentions_parametric: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


FIELDS: dict[str, type] = {f.name: f.type for f in fields(Item)}
FIELD_NAMES: tuple[str, ...] = tuple(FIELDS)


def answer_position(sentences: list[str], answer: str) -> str:
    """Where the first sentence that states ``answer`` sits: beginning, middle or end."""
    for i, sentence in enumerate(sentences):
        if contains(sentence, answer):
            if i == 0:
                return "beginning"
            return "end" if i == len(sentences) - 1 else "middle"
    raise ValueError(f"answer {answer!r} is in none of the sentences")


def capitalize_first(text: str) -> str:
    return text[:1].upper() + text[1:]


def fill(template: str, **values: str) -> str:
    """Fill ``{name}`` placeholders; ``{Name}`` gets the value with a capital first letter."""
    out = template
    for key, value in values.items():
        out = out.replace("{" + key + "}", value)
        out = out.replace("{" + key.capitalize() + "}", capitalize_first(value))
    return out
