"""Result files: records.jsonl (appended and flushed per record), meta.json, results.csv."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pandas as pd

from attnbench.core import metrics
from attnbench.core.errors import BadInput, shown
from attnbench.core.record import DEVICE_COLUMNS, IDENTITY_COLUMNS, STATUSES  # noqa: F401  (STATUSES re-exported)

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


def _parses(line: bytes) -> bool:
    try:
        json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False
    return True


def mend_tail(path: Path) -> None:
    """Before appending: a last line without its newline is cut off when it does not parse
    (a kill mid-write; its pair runs again) and completed with its newline when it does."""
    if not path.exists():
        return
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    start = data.rfind(b"\n") + 1
    if _parses(data[start:]):
        with open(path, "ab") as fh:
            fh.write(b"\n")
    else:
        os.truncate(path, start)  # in place: a kill now loses nothing more


class RecordWriter:
    """Appends one JSON line per record and flushes it, so a killed run loses at most one."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / RECORDS
        self.path.parent.mkdir(parents=True, exist_ok=True)
        mend_tail(self.path)
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


# What every reader joins or counts a record by; a line without them is not a record.
REQUIRED = ("key", "backend", "status")
ALLOWED = f"allowed: one JSON object per line with {', '.join(REQUIRED)} (nothing was changed)"
_told_cut: set[tuple] = set()  # cut-off tails already reported (said once per process)


def _kind(value) -> str:
    """What a JSON value that is not a record is, for the error line."""
    if value is None or isinstance(value, bool):
        return f"JSON {json.dumps(value)}"
    if isinstance(value, list):
        return "a JSON list"
    if isinstance(value, str):
        return "a JSON string"
    if isinstance(value, (int, float)):
        return "a JSON number"
    missing = [k for k in REQUIRED if k not in value]
    if missing:
        return f"an object without {', '.join(missing)}"
    wrong = next(k for k in REQUIRED if not (isinstance(value[k], str) and value[k]))
    return f"its {wrong} is {shown(value[wrong], 40)}, not a non-empty string"


def _is_record(value) -> bool:
    return isinstance(value, dict) and all(
        isinstance(value.get(k), str) and value[k] for k in REQUIRED)


def _record(path: Path, n: int, raw: bytes) -> dict:
    """Line ``n`` of ``path`` as a record; BadInput naming the line when it is not one."""
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        what = f"byte 0x{raw[exc.start]:02x} at column {exc.start + 1} is not UTF-8"
    except json.JSONDecodeError as exc:
        what = f"not JSON: {exc.msg} at column {exc.colno}"
    else:
        if _is_record(value):
            return value
        what = _kind(value)
    raise BadInput(f"{path}:{n}: not a record ({what}); {ALLOWED}")


def _tell_cut(path: Path, size: int) -> None:
    told = (str(path.resolve()), size)
    if told not in _told_cut:
        _told_cut.add(told)
        print(f"attnbench: {path}: the last line was cut off, probably by a kill; it is "
              f"ignored and its pair will run again", file=sys.stderr)


def record_lines(path: str | Path) -> list[dict]:
    """Every record of a records file, in file order; the one reader of records files.

    Each line must be a record (a JSON object with ``REQUIRED``): any other line is bad
    input naming it. A last line without its newline that does not parse is what a kill
    mid-write leaves: it is reported once and ignored (``mend_tail`` cuts it on resume)."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with its newline
    rows = [_record(path, n, raw) for n, raw in enumerate(lines, 1) if raw.strip()]
    if tail.strip():
        if _parses(tail):
            rows.append(_record(path, len(lines) + 1, tail))
        else:
            _tell_cut(path, len(data))
    return rows


def latest(records: list[dict]) -> list[dict]:
    """One record per (run id, key, backend): a pair run again (``--resume --retry``)
    supersedes its earlier record, which stays in the file as history."""
    def pair(r: dict) -> tuple:
        return r.get("run_id"), r["key"], r["backend"]

    last = {pair(r): i for i, r in enumerate(records)}
    return [r for i, r in enumerate(records) if last[pair(r)] == i]


def read_records(run_dir: str | Path) -> list[dict]:
    """The run's records (a merged dataset holds several runs), the latest of each pair."""
    return latest(record_lines(Path(run_dir) / RECORDS))


def no_records_yet(where: str | Path, meta: dict) -> str:
    """The one line for a run that holds no record (stopped before its first pair ended)."""
    run_id = meta.get("run_id") or Path(where).name
    return (f"{where}: run {run_id} holds no record yet (stopped before its first pair "
            f"finished?); allowed: a run with records (attnbench run --resume {run_id} "
            f"measures its pairs)")


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
        return records_frame(latest(record_lines(p)))
    if (p / RECORDS).exists() or (p / META).is_file():  # (a run before its first record)
        return records_frame(read_records(p))
    if p.is_dir():
        runs = sorted(d for d in p.iterdir() if (d / RECORDS).exists())
        if runs:
            return records_frame([r for d in runs for r in read_records(d)])
    raise BadInput(f"{path}: no records here (expected a run directory holding {RECORDS}, "
                   f"a {CSV}, or a directory of runs)")
