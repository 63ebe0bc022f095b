"""Runs from different machines or commits as one dataset: ``attnbench merge RUN... --out DIR``.

A dataset is a folder like a run's: ``records.jsonl`` holds every source run's records, each
keeping its ``run_id`` and its environment columns; ``meta.json`` lists each source run's own
meta (device, versions, ceilings, suite, claims, ranks) under ``merged_from``. Readers split
it back into its runs (``parts``), so ``report`` puts the devices side by side as it does for
several run folders, and ``compare`` sets two of its runs against each other.

Merging is a union: the same run given twice (or in two datasets) counts once; two different
runs that happen to share an id (``--run-id nightly`` on two machines) are kept apart, the
later one renamed ``<id>-2``. Two copies of one run that disagree on a record are refused.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pandas as pd

from attnbench.core.errors import BadInput
from attnbench.core.record import FORMAT_VERSION
from attnbench.runs import model_records, rank_folders, record_files

SOURCES = "merged_from"


def is_dataset(meta: dict) -> bool:
    return bool(meta.get(SOURCES))


def parts(meta: dict, df: pd.DataFrame) -> list[tuple[dict, pd.DataFrame]]:
    """A run folder's runs: a plain run is one; a dataset is each source with its records."""
    if not is_dataset(meta):
        return [(meta, df)]
    ids = df["run_id"].astype(str) if "run_id" in df.columns else pd.Series(dtype=str)
    return [(m, df[ids == str(m.get("run_id"))].copy()) for m in meta[SOURCES]]


def run_ids(meta: dict) -> list[str]:
    return [str(m.get("run_id")) for m in meta.get(SOURCES) or []]


def _load_input(path: Path) -> tuple[list[dict], list[dict]]:
    """(source metas, records) of a run or dataset folder; bad input is one line."""
    if not path.is_dir():
        raise BadInput(f"{path}: no such run directory; allowed: run folders "
                       f"(results/<run-id>) or merged datasets")
    if not (path / record_files.META).is_file() or not (path / record_files.RECORDS).is_file():
        raise BadInput(f"{path}: not a run (no {record_files.META} and "
                       f"{record_files.RECORDS} inside); "
                       f"allowed: run folders (results/<run-id>) or merged datasets")
    if rank_folders.pending(path):
        raise BadInput(f"{path}: holds the rank folders of an unfinished sharded run; "
                       f"allowed: a finished run (complete it with attnbench run --resume "
                       f"{path.name} --out {path.parent})")
    meta = record_files.read_meta(path)
    rows = record_files.read_records(path)
    if is_dataset(meta):
        return list(meta[SOURCES]), rows
    run_id = str(meta.get("run_id") or path.name)
    return [meta | {"run_id": run_id}], [r | {"run_id": run_id} for r in rows]


def _same_run(a: dict, b: dict) -> bool:
    return a.get("started") == b.get("started") and (
        a.get("environment_id") == b.get("environment_id"))


def merge_runs(inputs: list[str | Path], out: str | Path) -> Path:
    """Write the dataset of ``inputs`` to ``out`` (a new folder); returns it."""
    out = Path(out)
    sources: list[dict] = []  # one meta per distinct run, in the order given
    rows: dict[tuple, dict] = {}  # (run_id, key, backend) -> record
    where: dict[tuple, Path] = {}
    for given in inputs:
        path = Path(given)
        if out.exists() and path.resolve() == out.resolve():
            raise BadInput(f"--out {out}: is one of the inputs; allowed: a new folder")
        metas, recs = _load_input(path)
        renamed = {}
        for m in metas:
            rid = str(m.get("run_id"))
            same = [s for s in sources if s["run_id"] == rid]
            if same and _same_run(same[0], m):
                continue  # the same run again: its records are checked below
            if same:  # another run that shares the id: kept apart under a new id
                n = 2
                while any(s["run_id"] == f"{rid}-{n}" for s in sources):
                    n += 1
                renamed[rid] = f"{rid}-{n}"
                m = m | {"run_id": renamed[rid], "renamed_from": rid}
            sources.append(dict(m))
        for r in recs:
            rid = str(r.get("run_id"))
            r = r | {"run_id": renamed.get(rid, rid)}
            k = (r["run_id"], r.get("key"), r.get("backend"))
            if k in rows and rows[k] != r:
                raise BadInput(f"{path}: run {k[0]}'s record ({k[2]}, {k[1]}) differs from "
                               f"the one in {where[k]}; allowed: distinct runs, or copies of "
                               f"one run that agree")
            rows.setdefault(k, r)
            where.setdefault(k, path)
    if not rows:
        raise BadInput(f"{', '.join(map(str, inputs))}: no record to merge; allowed: runs "
                       f"with records")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BadInput(f"--out {out}: already exists; allowed: a new (or empty) folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"--out {out}: cannot create it ({exc.strerror})") from None
    with record_files.RecordWriter(out) as writer:
        for r in rows.values():
            writer.write(r)
    starts = [str(s.get("started")) for s in sources if s.get("started")]
    ends = [str(s.get("ended")) for s in sources if s.get("ended")]
    record_files.write_meta(out, {
        "format_version": FORMAT_VERSION,
        "run_id": out.name,
        "suite": "+".join(dict.fromkeys(str(s.get("suite")) for s in sources
                                        if s.get("suite"))),
        "started": min(starts) if starts else None,
        "ended": max(ends) if ends else None,
        "merged_at": dt.datetime.now().astimezone().isoformat(),
        SOURCES: sources,
    })
    record_files.write_csv(out)
    return out


def describe(out: Path) -> str:
    meta = record_files.read_meta(out)
    n = len(record_files.read_records(out))
    runs = "; ".join(f"{m.get('run_id')} ({(m.get('environment') or {}).get('device_name')})"
                     for m in meta.get(SOURCES) or [])
    return f"{n} records from {len(meta.get(SOURCES) or [])} run(s): {runs}"


def pick(path: str | Path, wanted: str | None = None) -> tuple[dict, pd.DataFrame]:
    """One run of a folder as (meta, records): a plain run, or the run ``wanted`` of a
    dataset (a dataset of one run needs no name)."""
    path = Path(path)
    df = record_files.load_results(path)
    if "format" in df.columns and (df["format"] == model_records.OLD_FORMAT).any():
        df = pd.DataFrame(model_records.read_model_records(path))  # an older model run
    meta = record_files.read_meta(path)
    found = parts(meta, df)
    own = str(meta.get("run_id") or path.name)
    if not is_dataset(meta) and wanted in (None, own):
        return found[0]
    if wanted is None and len(found) == 1:
        return found[0]
    for m, part in found:
        if str(m.get("run_id")) == wanted:
            return m, part
    ids = ", ".join(run_ids(meta)) or own
    what = f"--runs {wanted!r}" if wanted else str(path)
    raise BadInput(f"{what}: {path} holds the runs {ids}; allowed: one of them, e.g. "
                   f"attnbench compare {path} --runs BASE_ID,NEW_ID")


def compare_sides(base: str, new: str | None, runs: str | None
                  ) -> tuple[tuple[dict, pd.DataFrame], tuple[dict, pd.DataFrame]]:
    """The two runs ``compare`` sets against each other: two folders (each a run, or a
    dataset with ``--runs`` naming the run), or one dataset and two of its runs (by default
    its only two)."""
    names = [t.strip() for t in runs.split(",")] if runs else []
    if runs is not None and (len(names) != 2 or not all(names)):
        raise BadInput(f"--runs {runs!r}: allowed: two run ids, BASE_ID,NEW_ID")
    if new is None:
        meta = record_files.read_meta(base)
        if not names:
            ids = run_ids(meta)
            if len(ids) != 2:
                raise BadInput(f"{base}: compare with one folder needs a merged dataset of two "
                               f"runs (it holds {len(ids) or 'one run, not a dataset'}); "
                               f"allowed: attnbench compare BASE NEW, or --runs BASE_ID,NEW_ID")
            names = ids
        return pick(base, names[0]), pick(base, names[1])
    return (pick(base, names[0] if names else None),
            pick(new, names[1] if names else None))
