"""Isolation: jobs run in a child process, so a crash or a hang costs one record, not the run.

The parent sends (case, backend, budget) over a pipe and waits up to the timeout. A child
that dies yields ``crashed`` (with its exit code or signal); one that does not answer in
time is killed and yields ``timeout``. Either way a fresh child takes the next job.
"""

from __future__ import annotations

import multiprocessing as mp
import signal

import torch

from .case import Case
from .ceilings import measure_ceilings
from .execute import CaseCache, execute
from .memory import configure_allocator
from .timing import TimingBudget


def setup_process(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)
    configure_allocator()


def _worker_main(conn, threads: int | None) -> None:
    setup_process(threads)
    cache = CaseCache()
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        if job[0] == "ceilings":
            conn.send(measure_ceilings(*job[1:]))
            continue
        case, backend, budget = job
        conn.send(execute(case, backend, budget, cache))


class InProcessExecutor:
    """No isolation: fastest, but a crash ends the run and a hang is never cut short."""

    def __init__(self, threads: int | None = None):
        setup_process(threads)
        self.cache = CaseCache()

    def run(self, case: Case, backend: str, budget: TimingBudget, timeout_s: float) -> dict:
        return execute(case, backend, budget, self.cache)

    def ceilings(self, dtypes: list[str], device: str) -> dict:
        return measure_ceilings(dtypes, device)

    def close(self) -> None:
        pass


class IsolatedExecutor:
    def __init__(self, threads: int | None = None):
        self.threads = threads
        self.ctx = mp.get_context("spawn")
        self.proc = None
        self.conn = None

    def _start(self) -> None:
        parent, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker_main, args=(child, self.threads),
                                     daemon=True)
        self.proc.start()
        child.close()
        self.conn = parent

    def _stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if kill:
            self.proc.kill()
        self.proc.join(timeout=10)
        self.conn.close()
        self.proc = self.conn = None

    def ceilings(self, dtypes: list[str], device: str) -> dict:
        """The device ceilings, measured in the worker: the process that measures records."""
        if self.proc is None or not self.proc.is_alive():
            self._start()
        self.conn.send(("ceilings", dtypes, device))
        return self.conn.recv()

    def run(self, case: Case, backend: str, budget: TimingBudget, timeout_s: float) -> dict:
        if self.proc is None or not self.proc.is_alive():
            self._start()
        timed_out = False
        try:
            self.conn.send((case, backend, budget))
            if self.conn.poll(timeout_s):
                return self.conn.recv()
            timed_out = True
        except (EOFError, BrokenPipeError, ConnectionResetError):
            pass  # the worker died; its pipe closed before it answered
        base = {"key": case.key, "backend": backend, **case.to_dict()}
        if timed_out:
            self._stop(kill=True)
            return base | {"status": "timeout",
                           "reason": f"no result within the {timeout_s:g} s limit; worker killed"}
        self.proc.join(timeout=30)
        code = self.proc.exitcode
        self._stop()
        if code is not None and code < 0:
            try:
                how = f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        return base | {"status": "crashed", "reason": f"worker process {how}"}

    def close(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        self._stop()
