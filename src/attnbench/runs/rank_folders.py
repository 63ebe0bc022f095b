"""Rank folders of a sharded run, and folding them into the run.

Under torchrun each rank writes under ``<run>/ranks/<rank>/``: its ``records.jsonl``
(appended and flushed per record, as a plain run does), its ``worker.log`` and ``rank.json``
(its device, environment, ceilings, start and end). Rank 0 folds them into the run once every
rank is done: records appended to the run's ``records.jsonl`` (each tagged with its ``rank``),
each rank's entry added to ``meta.json``'s ``ranks``, logs appended to the run's
``worker.log``, the folders removed. A run whose ranks were killed keeps its rank folders;
the next start of the run (``--resume``, with any number of ranks) folds them first, so a
dead rank loses only the pair it had in flight.

Folding is idempotent: a record already in the run (same key, backend and time) is not
added again, a rank entry already listed is not listed again, so a fold killed halfway is
simply done again.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

from attnbench.runs import record_files

RANKS = "ranks"
RANK_META = "rank.json"


def folder(run_dir: Path, rank: int) -> Path:
    path = Path(run_dir) / RANKS / str(rank)
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_rank(where: Path, shard_info: dict, meta: dict) -> None:
    """This rank's entry: where it ran and what it measured there."""
    entry = shard_info | {k: meta.get(k) for k in (
        "environment", "environment_id", "ceilings", "slow_dtypes", "ended")}
    record_files.write_atomic(Path(where) / RANK_META,
                         json.dumps(entry, indent=2, sort_keys=True, default=str) + "\n")


def _identity(row: dict) -> tuple:
    return row.get("key"), row.get("backend"), row.get("recorded_at")


def _when(row: dict) -> float:
    try:
        return dt.datetime.fromisoformat(str(row.get("recorded_at"))).timestamp()
    except ValueError:
        return float("inf")


def pending(run_dir: Path) -> list[Path]:
    base = Path(run_dir) / RANKS
    if not base.is_dir():
        return []
    return sorted((d for d in base.iterdir() if d.is_dir() and d.name.isdigit()),
                  key=lambda d: int(d.name))


def fold(run_dir: Path, meta: dict | None = None) -> int:
    """Fold every rank folder into the run (see the module's docstring); ``meta`` is the
    lead's meta dict when it has one in hand (it gets the ranks' entries). Returns how many
    records were added."""
    run_dir = Path(run_dir)
    folders = pending(run_dir)
    if not folders:
        return 0
    main = run_dir / record_files.RECORDS
    seen = {_identity(r) for r in record_files.record_lines(main)}
    new = []
    for d in folders:
        for row in record_files.record_lines(d / record_files.RECORDS):
            if _identity(row) not in seen:
                seen.add(_identity(row))
                new.append(row | {"rank": row.get("rank", int(d.name))})
    if new:
        new.sort(key=_when)  # stable: ranks' records interleaved as they were measured
        record_files.mend_tail(main)  # a torn tail of a killed plain attempt
        text = main.read_text(encoding="utf-8") if main.exists() else ""
        record_files.write_atomic(main, text + "".join(json.dumps(r) + "\n" for r in new))

    if meta is None and (run_dir / record_files.META).exists():
        meta = record_files.read_meta(run_dir)
    if meta is not None:
        entries = list(meta.get("ranks") or [])
        listed = {(e.get("rank"), e.get("started")) for e in entries}
        for d in folders:
            try:
                entry = json.loads((d / RANK_META).read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                continue  # killed before it said where it ran: its records still count
            if (entry.get("rank"), entry.get("started")) not in listed:
                entries.append(entry)
        meta["ranks"] = sorted(entries, key=lambda e: (e.get("rank", 0), str(e.get("started"))))
        record_files.write_meta(run_dir, meta)  # before the folders go: a kill loses no entry

    with open(run_dir / record_files.WORKER_LOG, "a", encoding="utf-8") as log:
        for d in folders:
            if (d / record_files.WORKER_LOG).exists():
                log.write(f"--- rank {d.name} ---\n")
                log.write((d / record_files.WORKER_LOG).read_text(encoding="utf-8",
                                                                   errors="replace"))
    for d in folders:
        shutil.rmtree(d)
    try:
        (run_dir / RANKS).rmdir()
    except OSError:
        pass
    return len(new)
