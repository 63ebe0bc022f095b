"""A model-level run organised: ``results/models/<run-id>/`` with ``records.jsonl`` (one
``Record`` per (model, batch, N, step, level, backend), appended and flushed), ``meta.json``
and ``results.csv``, as kernel runs. Model runs sit under ``results/models/`` so that tools
reading kernel runs (``attnbench report``, the index) never mistake one for a kernel run.

Each record carries the run context of a kernel record: run id, suite, format version, the
key of its ``ModelCase``, status with a one-line reason, the environment columns and id. A
run resumes like a kernel run: the pairs it recorded are skipped, the rest measured."""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from pathlib import Path

import torch

from attnbench.core.dtypes import torch_dtype
from attnbench.core.errors import BadInput
from attnbench.core.record import FORMAT_VERSION, Record
from attnbench.measure import hf_adapter
from attnbench.measure.model_step import EAGER, ModelJob, measure_job, one_line
from attnbench.measure.model_zoo import REAL, build
from attnbench.runs import environment, record_files, run_folder
from attnbench.runs.model_records import read_model_records
from attnbench.runs.model_suite import ModelSuite, parse_model_suite

FOLDER = "models"
KIND = "models"  # meta.json's kind of a model run


def unavailable_records(job: ModelJob, reason: str, status: str = "unavailable"
                        ) -> list[Record]:
    return [Record.new(job.case(step), backend, status, reason)
            for step in job.steps for backend in job.backends]


def records_of(job: ModelJob, suite: ModelSuite) -> list[Record]:
    """Every record of one job; a model that cannot be built costs that job only."""
    reason = hf_adapter.transformers_reason()
    if reason is None and job.model == REAL:
        from attnbench.core.pretrained import unavailable_reason
        reason = unavailable_reason()
    if reason:
        return unavailable_records(job, reason)
    try:
        built = build(job.model, job.scale, job.batch, job.seq_len, torch_dtype(job.dtype),
                      job.device)
    except torch.OutOfMemoryError as exc:
        return unavailable_records(job, one_line(exc), "oom")
    except Exception as exc:
        return unavailable_records(job, one_line(exc), "error")
    try:
        return measure_job(job, built, suite.budget)
    finally:
        del built
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def remaining(job: ModelJob, done: set[tuple[str, str]]) -> ModelJob | None:
    """The part of ``job`` whose model-level pairs are not recorded (None: all are), with
    eager kept for a forward (the reference its drift is measured against)."""
    todo = [(s, b) for s in job.steps for b in job.backends
            if (job.case(s).key, b) not in done]
    if not todo:
        return None
    steps = tuple(s for s in job.steps if any(t[0] == s for t in todo))
    backends = tuple(b for b in job.backends if any(t[1] == b for t in todo)
                     or (b == EAGER and "fwd" in steps))
    return dataclasses.replace(job, steps=steps, backends=backends)


def finish_record(rec: Record, context: dict) -> dict:
    """The run-level columns and the environment around a record: the line written."""
    row = {"run_id": context["run_id"], "suite": context["suite"],
           "format_version": FORMAT_VERSION, **rec.to_row()}
    row.setdefault("noisy", False)
    row["recorded_at"] = dt.datetime.now().astimezone().isoformat()
    return row | context["env"]


def recorded_suite(out: str | Path, run_id: str, known_backends: list[str]
                   ) -> tuple[ModelSuite, str]:
    """(the suite, the device) a model run recorded, for ``--resume``; BadInput naming the
    run when it cannot be resumed."""
    run_dir = Path(out) / FOLDER / run_folder.check_name(run_id, "--resume")
    meta = record_files.read_meta(run_dir)
    if not meta:
        raise BadInput(f"--resume {run_id}: no model run {run_dir} (no "
                       f"{record_files.META}); allowed: a run under {Path(out) / FOLDER}")
    if not isinstance(meta.get("suite_toml"), str) or not meta.get("device"):
        raise BadInput(f"--resume {run_id}: {run_dir / record_files.META} records no copy of "
                       f"its suite (a run from before resume); allowed: a new run")
    device = meta["device"]
    suite = parse_model_suite(meta["suite_toml"], Path(meta.get("suite_path") or run_id),
                              known_backends, device)
    return suite, device


def _open(root: Path, suite: ModelSuite, device: str, run_id: str | None,
          resume: bool) -> Path:
    if resume:
        run_dir = root / run_folder.check_name(run_id, "--resume")
        if not (run_dir / record_files.META).is_file():
            raise BadInput(f"--resume {run_id}: no model run {run_dir}")
        return run_dir
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    rid = run_folder.check_name(run_id) if run_id else (
        f"{stamp}-{run_folder.slug(suite.name)}-{torch.device(device).type}")
    return run_folder.new_run_dir(root, rid, explicit=run_id is not None)


def run_models(suite: ModelSuite, out: str | Path, device: str, run_id: str | None = None,
               log=print, resume: bool = False, retry: tuple[str, ...] = ()) -> Path:
    """Measure every job of ``suite`` into a new run, or (``resume``) the pairs the run
    ``run_id`` has not recorded yet, or recorded with a status in ``retry``."""
    root = run_folder.out_root(Path(out) / FOLDER)
    run_dir = _open(root, suite, device, run_id, resume)
    with run_folder.RunLock(run_dir):
        done = {(r["key"], r["backend"]) for r in read_model_records(run_dir)
                if r["status"] not in retry} if resume else set()
        env = environment.collect(device)
        context = {"run_id": run_dir.name, "suite": suite.name,
                   "env": {**environment.record_fields(env), "env_id": environment.env_id(env)}}
        meta = record_files.read_meta(run_dir) if resume else {}
        meta.update({
            "kind": KIND, "format_version": FORMAT_VERSION, "run_id": run_dir.name,
            "suite": suite.name, "suite_path": str(suite.path), "suite_toml": suite.text,
            "description": suite.description, "device": device, "environment": env,
            "environment_id": environment.env_id(env),
            "transformers": environment._version("transformers"),
            "tested_transformers": ",".join(hf_adapter.TESTED_RANGE),
            "timing": vars(suite.budget),
            "started": meta.get("started") or dt.datetime.now().isoformat(), "ended": None})
        if resume:
            meta["resumed"] = [*meta.get("resumed", []), dt.datetime.now().isoformat()]
        record_files.write_meta(run_dir, meta)
        with record_files.RecordWriter(run_dir) as writer:
            for i, whole in enumerate(suite.jobs, 1):
                said = (f"[{i}/{len(suite.jobs)}] {whole.model} ({whole.scale}) batch "
                        f"{whole.batch} N {whole.seq_len}")
                job = remaining(whole, done)
                if job is None:
                    log(f"{said}: recorded already")
                    continue
                t0 = time.perf_counter()
                log(said)
                for rec in records_of(job, suite):
                    if (rec.key, rec.backend) not in done:
                        writer.write(finish_record(rec, context))
                log(f"    {time.perf_counter() - t0:.0f} s")
        meta["ended"] = dt.datetime.now().isoformat()
        record_files.write_meta(run_dir, meta)
        record_files.write_csv(run_dir)
    return run_dir
