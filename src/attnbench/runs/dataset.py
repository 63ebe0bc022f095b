"""Several runs read together, each with a label that says what tells it apart.

A CPU run beside an H200 run is labelled by device, two commits on one machine by commit;
runs that differ in neither keep their run ids. The label replaces ``run_id`` in the combined
records, so ``tables.line_columns`` (which adds ``run_id`` when it varies) puts the device or
commit into every legend and table row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from attnbench.runs import merge
from attnbench.runs import record_files as records


@dataclass
class Run:
    path: Path
    meta: dict
    records: pd.DataFrame
    label: str = ""

    @property
    def env(self) -> dict:
        return self.meta.get("environment") or {}

    @property
    def run_id(self) -> str:
        return str(self.meta.get("run_id") or self.path.name)

    @property
    def device(self) -> str:
        env = self.env
        name = env.get("device_name") or env.get("device") or "?"
        cap = env.get("cpu_capability") if env.get("device") == "cpu" else None
        return f"{name} ({cap})" if cap else str(name)

    @property
    def commit(self) -> str:
        commit = (self.env.get("git_commit") or "?")[:7]
        return commit + ("+dirty" if self.env.get("git_dirty") else "")

    @property
    def date(self) -> str:
        return str(self.meta.get("started") or "")[:10]

    @property
    def suite(self) -> str:
        return str(self.meta.get("suite") or "")


def load(run_dirs: list[str | Path]) -> list[Run]:
    runs = []
    for d in run_dirs:
        path = Path(d)
        for meta, df in merge.parts(records.read_meta(path), records.load_results(path)):
            run = Run(path, meta, df)  # a merged dataset: one Run per source run
            df["run_id"] = run.run_id  # one run per source, whatever its rows say
            if run.suite:
                df["suite"] = run.suite
            runs.append(run)
    for run, label in zip(runs, labels(runs)):
        run.label = label
    return runs


def labels(runs: list[Run]) -> list[str]:
    """Device when devices differ; the run id where the device does not tell the runs apart
    (a commit such as ``@df68299+dirty`` names no run a reader knows; the environment table
    lists each run's commit)."""
    if len(runs) == 1:
        return [runs[0].run_id]
    devices = [r.device for r in runs]
    out = devices if len(set(devices)) > 1 else ["" for _ in runs]
    if not all(out) or len(set(out)) < len(out):
        out = [f"{o} {r.run_id}".strip() for o, r in zip(out, runs)]
    return out


def combined(runs: list[Run]) -> pd.DataFrame:
    """Every run's records, ``run_id`` replaced by the run's label."""
    frames = [r.records.assign(run_id=r.label) for r in runs if not r.records.empty]
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True)
