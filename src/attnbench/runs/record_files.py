"""Result files: records.jsonl (appended and flushed per record), meta.json, results.csv."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pandas as pd

from attnbench.core import metrics
from attnbench.core.errors import BadInput
from attnbench.core.record import DEVICE_COLUMNS, IDENTITY_COLUMNS, STATUSES  # noqa: F401

RECORDS = "records.jsonl"
META = "meta.json"
CSV = "results.csv"
WORKER_LOG = "worker.log"  # what backends print, and a crashed worker's last words

# results.csv's column order: identity, the declared metrics, the device's state, the rest.
LEADING_COLUMNS = [*IDENTITY_COLUMNS, *metrics.NAMES, *DEVICE_COLUMNS]


def _clean(value):
    """JSON has no NaN/Inf: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _drop_torn_tail(path: Path) -> None:
    """A run killed mid-write leaves a last line without its newline: cut it before appending."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        os.truncate(path, data.rfind(b"\n") + 1)  # in place: a kill now loses nothing more


class RecordWriter:
    """Appends one JSON line per record and flushes it, so a killed run loses at most one."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / RECORDS
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _drop_torn_tail(self.path)
        self._fh = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        self._fh.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_records(run_dir: str | Path) -> list[dict]:
    """The run's records, one per (key, backend) of each run id (a merged dataset holds
    several runs): a pair run again (``--resume --retry``) supersedes its earlier record,
    which stays in the file as history."""
    path = Path(run_dir) / RECORDS
    if not path.exists():
        return []
    records = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if n == len(lines):  # a run killed mid-write leaves at most a torn last line
                continue
            raise BadInput(f"{path}:{n}: not a JSON record; allowed: one JSON object "
                           f"per line") from None
    def pair(r: dict) -> tuple:
        return r.get("run_id"), r.get("key"), r.get("backend")

    latest = {pair(r): i for i, r in enumerate(records)}
    return [r for i, r in enumerate(records) if latest[pair(r)] == i]


def write_atomic(path: Path, text: str) -> None:
    """Write through a temporary file and rename: a reader (or a kill) never sees half."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_meta(run_dir: Path, meta: dict) -> None:
    write_atomic(Path(run_dir) / META,
                 json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")


def read_meta(run_dir: str | Path) -> dict:
    path = Path(run_dir) / META
    if not path.exists():
        return {}
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: corrupt ({type(exc).__name__}); allowed: the JSON object "
                       f"attnbench run writes") from None
    if not isinstance(meta, dict):
        raise BadInput(f"{path}: not a JSON object; allowed: the object attnbench run writes")
    return meta


def records_frame(records: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(records)
    front = [c for c in LEADING_COLUMNS if c in df.columns]
    return df[front + [c for c in df.columns if c not in front]]


def write_csv(run_dir: Path) -> Path:
    df = records_frame(read_records(run_dir)).drop(columns=["samples_ms"], errors="ignore")
    path = Path(run_dir) / CSV
    write_atomic(path, df.to_csv(index=False))
    return path


def load_results(path: str | Path) -> pd.DataFrame:
    """A run directory, its records.jsonl or results.csv, or a directory of runs -> DataFrame."""
    p = Path(path)
    if p.is_file():
        if p.suffix == ".csv":
            return pd.read_csv(p)
        return records_frame(read_records(p.parent))
    if (p / RECORDS).exists():
        return records_frame(read_records(p))
    if p.is_dir():
        runs = sorted(d for d in p.iterdir() if (d / RECORDS).exists())
        if runs:
            return records_frame([r for d in runs for r in read_records(d)])
    raise BadInput(f"{path}: no records here (expected a run directory holding {RECORDS}, "
                   f"a {CSV}, or a directory of runs)")
