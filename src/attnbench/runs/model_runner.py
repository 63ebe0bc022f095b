"""A model-level run organised: ``results/models/<run-id>/`` with ``records.jsonl`` (one line
per (model, batch, N, step, level, backend), appended and flushed), ``meta.json`` and
``results.csv``, as kernel runs. Model runs sit under ``results/models/`` so that tools reading
kernel runs (``attnbench report``, the index) never mistake one for a kernel run.

Each record carries the run context of a kernel record: run id, suite, ``key`` (the model
job's identity, so ``load_results`` reads it), status with a one-line reason, the environment
columns and id."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import torch

from attnbench.core.dtypes import torch_dtype
from attnbench.measure import hf_adapter
from attnbench.measure.model_step import ModelJob, measure_job, one_line
from attnbench.measure.model_zoo import REAL, build
from attnbench.runs import environment, record_files, run_folder
from attnbench.runs.model_suite import ModelSuite

FOLDER = "models"
FORMAT = "models-1"


def job_key(job: ModelJob, step: str, level: str) -> str:
    scale = "real" if job.model == REAL else job.scale
    return (f"{job.model}-{scale}-b{job.batch}-n{job.seq_len}-{job.dtype}-{job.device}-"
            f"{step}-{level}")


def unavailable_records(job: ModelJob, reason: str) -> list[dict]:
    return [{"model": job.model, "scale": job.scale, "batch": job.batch,
             "seq_len": job.seq_len, "dtype": job.dtype, "device": job.device,
             "backend": backend, "step": step, "level": "model", "status": "unavailable",
             "reason": reason} for step in job.steps for backend in job.backends]


def records_of(job: ModelJob, suite: ModelSuite) -> list[dict]:
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
        return [{**r, "status": "oom"} for r in unavailable_records(job, one_line(exc))]
    except Exception as exc:
        return [{**r, "status": "error"} for r in unavailable_records(job, one_line(exc))]
    try:
        return measure_job(job, built, suite.budget)
    finally:
        del built
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def run_models(suite: ModelSuite, out: str | Path, device: str, run_id: str | None = None,
               log=print) -> Path:
    root = run_folder.out_root(Path(out) / FOLDER)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    rid = run_folder.check_name(run_id) if run_id else (
        f"{stamp}-{run_folder.slug(suite.name)}-{torch.device(device).type}")
    run_dir = run_folder.new_run_dir(root, rid, explicit=run_id is not None)
    env = environment.collect(device)
    context = {"run_id": run_dir.name, "suite": suite.name, "format": FORMAT,
               "env_id": environment.env_id(env), **environment.record_fields(env)}
    meta = {"kind": "models", "run_id": run_dir.name, "suite": suite.name,
            "suite_path": str(suite.path), "description": suite.description, "env": env,
            "transformers": environment._version("transformers"),
            "tested_transformers": ",".join(hf_adapter.TESTED_RANGE),
            "timing": vars(suite.budget), "started": dt.datetime.now().isoformat()}
    record_files.write_meta(run_dir, meta)
    with run_folder.RunLock(run_dir), record_files.RecordWriter(run_dir) as writer:
        for i, job in enumerate(suite.jobs, 1):
            t0 = time.perf_counter()
            log(f"[{i}/{len(suite.jobs)}] {job.model} ({job.scale}) batch {job.batch} "
                f"N {job.seq_len}")
            for rec in records_of(job, suite):
                rec["key"] = job_key(job, rec["step"], rec["level"])
                writer.write({**context, **rec})
            log(f"    {time.perf_counter() - t0:.0f} s")
    meta["ended"] = dt.datetime.now().isoformat()
    record_files.write_meta(run_dir, meta)
    record_files.write_csv(run_dir)
    return run_dir
