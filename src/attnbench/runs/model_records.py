"""The records of a model run as every reader takes them: the checked lines of its records
file (``record_files.read_records``), with a line of the first model-run layout (format
``models-1``: its own timing names, ``step``, ``scale``, peak memory in MiB) converted on
reading into the columns a model run writes now. The file itself is never rewritten."""

from __future__ import annotations

from pathlib import Path

from attnbench.core.model_case import ModelCase
from attnbench.core.record import Record
from attnbench.measure.budget import TimingBudget
from attnbench.measure.execute import sample_columns
from attnbench.measure.model_zoo import REAL
from attnbench.runs import record_files

OLD_FORMAT = "models-1"
# The old line's identity and timing fields: rebuilt as a ModelCase and sample columns.
OLD_IDENTITY = ("key", "backend", "status", "reason", "model", "scale", "batch", "seq_len",
                "dtype", "device", "step", "level")
OLD_TIMING = ("time_ms", "time_ms_lo", "time_ms_hi", "stop", "peak_mem_mb")


def from_models_1(row: dict) -> dict:
    """A ``models-1`` line as the line a model run writes now; its key is unchanged."""
    size = "real" if row["model"] == REAL else row["scale"]
    case = ModelCase(row["model"], size, row["batch"], row["seq_len"], row["dtype"],
                     row["device"], row["step"], row["level"])
    rest = {k: v for k, v in row.items() if k not in OLD_IDENTITY and k not in OLD_TIMING}
    rec = Record.new(case, row["backend"], row["status"], row.get("reason") or "", **rest)
    if row.get("samples_ms"):
        rec.update(**sample_columns(row["samples_ms"], row.get("stop") or "", [],
                                    TimingBudget()))
    if row.get("peak_mem_mb") is not None:
        rec.update(peak_mem_bytes=round(row["peak_mem_mb"] * 2**20))
    return rec.to_row()


def converted(row: dict) -> dict:
    return from_models_1(row) if row.get("format") == OLD_FORMAT else row


def read_model_records(run_dir: str | Path) -> list[dict]:
    """The run's records, the latest of each pair, old-layout lines converted."""
    return [converted(r) for r in record_files.read_records(run_dir)]
