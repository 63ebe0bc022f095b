"""The correctness harness: backends on small cases against the float64 reference.

A check is the run's own: availability, support, setup and one call compared with the
float64 evaluation under the dtype's tolerance (``execute.open_job``, whose verdict is
``core.accuracy``'s), with no timing. ``check_here`` runs it in this process (the tests on a
CPU); ``check_cases`` and ``run_tasks`` run each case in the run's worker
(``measure/worker.py``), ``jobs`` of them at once, so a case that crashes its process or
hangs costs that case alone, and a process whose CUDA context a case poisoned is retired
and replaced before the next case. ``scripts/gpu_correctness.py`` is a CLI over this and
the GPU check's task list (``measure/gpu_check.py``).

Each check gives rows (the GPU check's JSON): ``check`` (a label), ``tensor``, ``ok``
(True, False, or None when it cannot run here: unsupported or unavailable, with the
reason in ``error``), ``status`` and the ``err_impl_*`` columns; ``task`` and ``task_s``
once run as a task. ``faults`` ({task index: "segv" or "cuda"}) inject a segfault or a
CUDA-like fault into tasks, to rehearse both on a CPU.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from attnbench.core.backend import Backend
from attnbench.core.case import Case
from attnbench.core.record import Record
from attnbench.measure.case_cache import CaseCache
from attnbench.measure.execute import CONTEXT_LOST, Candidate, open_job
from attnbench.measure.worker import IsolatedExecutor, WorkerConfig

TASK_TIMEOUT_S = 600.0  # a cold compile of a large kernel on a loaded machine fits in this
NOT_RUNNABLE = ("unsupported", "unavailable")


@dataclass(frozen=True)
class Task:
    """``fn(*args)`` run in a worker: it returns rows; ``label`` names it when it fails."""

    fn: Callable[..., list[dict]]
    args: tuple
    label: str


def check_here(case: Case, backend: str | Backend, cache: CaseCache | None = None) -> Record:
    """The check in this process: a record whose status is ok, wrong, unsupported,
    unavailable, error or oom, with the error columns when the call ran."""
    opened = open_job(case, backend, cache or CaseCache())
    return opened.record if isinstance(opened, Candidate) else opened


def record_row(record: Record, label: str | None = None) -> dict:
    """A record's verdict as a row: ok True, None when it cannot run here, else False."""
    status = record.status
    ok = True if status == "ok" else None if status in NOT_RUNNABLE else False
    errors = {k: v for k, v in record.metrics.items() if k.startswith("err_impl")}
    row = {"check": label or f"backend {record.backend} {record.case.dtype} {record.case.key}",
           "tensor": "-", "ok": ok, "status": status, **errors}
    if ok is not True:
        row["error"] = record.reason
    if ok is False and (record.info.get("context_lost")
                        or is_cuda_fault(RuntimeError(record.reason))):
        row["cuda_fault"] = True  # this process's context is gone: retire it
    return row


def check_rows(case: Case, backend: str, label: str | None = None) -> list[dict]:
    """One case's rows (the worker's side of ``check_task``)."""
    return [record_row(check_here(case, backend), label)]


def check_task(case: Case, backend: str, label: str | None = None) -> Task:
    label = label or f"backend {backend} {case.dtype} {case.key}"
    return Task(check_rows, (case, backend, label), label)


def check_cases(backend: str, cases: list[Case], jobs: int = 1,
                timeout_s: float = TASK_TIMEOUT_S) -> list[dict]:
    """Each case of ``backend`` checked in a worker; rows in the cases' order."""
    return check_jobs([(case, backend) for case in cases], jobs, timeout_s)


def check_jobs(pairs: list[tuple[Case, str]], jobs: int = 1, timeout_s: float = TASK_TIMEOUT_S,
               faults: dict[int, str] | None = None) -> list[dict]:
    """Each (case, backend) pair checked in a worker; rows in the pairs' order."""
    rows: list[dict] = []
    run_tasks([check_task(c, b) for c, b in pairs], jobs, rows.extend, faults, timeout_s)
    return sorted(rows, key=lambda r: r["task"])


def default_jobs(requested: int | None = None) -> int:
    """Workers to run: the CPUs this process may use (its affinity mask), not the host's."""
    if requested:
        return requested
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return os.cpu_count() or 2


def is_cuda_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is a CUDA fault, after which every later call of the process fails
    (not a candidate that does not fit); Triton's launcher's words included when present."""
    try:
        from attnbench.implementations._triton_flash_kernels import is_cuda_fault as kernels
    except ImportError:  # no Triton: torch's own words
        text = str(exc)
        return "CUDA error" in text or any(m in text for m in CONTEXT_LOST)
    return kernels(exc)


POISONED = ""  # set in a worker once one of its tasks raised a CUDA fault (injected or real)


def inject(fault: str, index: int) -> None:
    """A fault of ``faults`` in task ``index``: what a real GPU may do, on demand."""
    global POISONED
    if POISONED:  # what every later call of a poisoned process would meet
        raise RuntimeError(f"CUDA error: an illegal memory access was encountered "
                           f"(this process was poisoned by {POISONED})")
    if fault == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "cuda":
        POISONED = f"task {index}"
        raise RuntimeError("CUDA error: an illegal memory access was encountered "
                           "(injected)")


def _sync() -> None:
    """An asynchronous CUDA fault surfaces in the task that caused it, not the next one."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def guarded(task: Task, index: int, fault: str = "") -> list[dict]:
    """``task`` in the worker: its rows, or one failing row with the exception; never raises."""
    t0 = time.perf_counter()
    try:
        inject(fault, index)
        rows = task.fn(*task.args)
        _sync()
    except Exception as exc:
        rows = [{"check": task.label, "tensor": "-", "ok": False,
                 "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(),
                 "cuda_fault": is_cuda_fault(exc)}]
    for r in rows:
        r["task_s"] = round(time.perf_counter() - t0, 2)
        r["task"] = index
    return rows


def _lost(task: Task, index: int, status: str, why: str) -> list[dict]:
    """The row of a task whose worker died (``crashed``) or was killed (``timeout``)."""
    what = ("its worker process died while running it" if status == "crashed"
            else "it did not finish in time")
    return [{"check": task.label, "tensor": "-", "ok": False, "task": index, "crashed": True,
             "error": f"{what} ({why}); the other tasks ran in other processes"}]


def run_tasks(tasks: list[Task], jobs: int, on_result: Callable[[list[dict]], None],
              faults: dict[int, str] | None = None, timeout_s: float = TASK_TIMEOUT_S,
              config: WorkerConfig | None = None) -> dict:
    """Every task in one of ``jobs`` workers at a time, in the list's order;
    ``on_result(rows)`` after each. A worker that died or hung (killed after ``timeout_s``)
    fails only its task and is replaced; one whose task raised a CUDA fault is retired and
    replaced, so the tasks after it run in a clean process. Returns counts: ``crashed``
    (tasks that cost their process) and ``retired`` processes. Interrupted (Ctrl-C, or a
    time limit's SIGINT), it kills every worker before re-raising."""
    faults = faults or {}
    made: list[IsolatedExecutor] = []
    todo = list(range(len(tasks)))[::-1]  # popped from the end: the list's order
    lock = threading.Lock()
    stats = {"crashed": 0, "retired": 0}

    def lane() -> None:
        executor = None
        try:
            while True:
                with lock:
                    if not todo:
                        return
                    i = todo.pop()
                if executor is None:
                    executor = IsolatedExecutor(config=config or WorkerConfig())
                    made.append(executor)
                status, rows = executor.call(guarded, (tasks[i], i, faults.get(i, "")),
                                             timeout_s)
                with lock:
                    if status != "done":  # the executor has stopped its process
                        stats["crashed"] += 1
                        rows = _lost(tasks[i], i, status, rows)
                    elif any(r.get("cuda_fault") for r in rows):
                        stats["retired"] += 1  # its CUDA context is poisoned: never reuse it
                        executor.close()
                        executor = None
                    on_result(rows)
        finally:
            if executor is not None:
                executor.close()

    lanes = [threading.Thread(target=lane, daemon=True) for _ in range(min(jobs, len(tasks)))]
    for t in lanes:
        t.start()
    try:
        for t in lanes:
            while t.is_alive():  # short joins: Ctrl-C (the time limit) reaches the caller
                t.join(0.2)
    except KeyboardInterrupt:
        for executor in made:  # no orphan may hold the GPU once the caller has stopped
            executor.kill()
        raise
    return stats
