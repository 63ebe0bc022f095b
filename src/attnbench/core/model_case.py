"""The identity of a model-level measurement: one model at one (batch, N), one step, one
level; what ``Case`` is to a kernel record. A ``Record`` holds it as its case, so model runs
write, resume, compare and pool records like kernel runs.

Its key is built like a Case key (the identity's parts joined by dashes) and is the key the
first model-run layout wrote, so records of either layout join."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

STEPS = ("fwd", "train")  # the inference forward; forward, loss and backward
LEVELS = ("model", "kernel")  # the whole step; the attention case it called, timed alone


@dataclass(frozen=True)
class ModelCase:
    model: str
    size: str  # the config's scale (tiny, cpu, h200); "real" for pretrained weights' own
    batch: int
    seq_len: int
    dtype: str
    device: str
    mode: str = "fwd"  # a step: fwd or train
    level: str = "model"

    def __post_init__(self):
        if self.mode not in STEPS:
            raise ValueError(f"unknown step {self.mode!r}; allowed: {', '.join(STEPS)}")
        if self.level not in LEVELS:
            raise ValueError(f"unknown level {self.level!r}; allowed: {', '.join(LEVELS)}")
        for name in ("batch", "seq_len"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got "
                                 f"{getattr(self, name)!r}")

    @property
    def key(self) -> str:
        """Stable string identity, used for resume and for joins across runs."""
        return (f"{self.model}-{self.size}-b{self.batch}-n{self.seq_len}-{self.dtype}-"
                f"{self.device}-{self.mode}-{self.level}")

    @property
    def job(self) -> tuple:
        """What the model was built for: the records of one job share it."""
        return self.model, self.size, self.batch, self.seq_len, self.dtype, self.device

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes) -> ModelCase:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_row(cls, row: dict) -> ModelCase:
        """The identity of a record line (KeyError naming a missing field)."""
        return cls(**{f.name: row[f.name] for f in dataclasses.fields(cls)})


COLUMNS = tuple(f.name for f in dataclasses.fields(ModelCase))
