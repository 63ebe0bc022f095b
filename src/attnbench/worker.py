"""Isolation: jobs run in a child process, so a crash or a hang costs one record, not the run.

The parent sends a job group (the (case, backend) pairs timed together) over a pipe and
waits up to the suite's per-job timeout for each heartbeat (one per job set up, one after
the group's timing) and then the records. A child that
dies yields ``crashed`` (with its exit code or signal); one that does not answer in time is
killed and yields ``timeout``. Either way a fresh child takes the next job; a group that
crashed or hung is rerun one job at a time, so only the guilty job's record says so.
"""

from __future__ import annotations

import multiprocessing as mp
import signal

import torch

from .case import Case
from .ceilings import measure_ceilings
from .execute import CaseCache, execute_group, merge_repeats
from .memory import configure_allocator
from .probe import DriftProbe
from .record import Record
from .timing import TimingBudget

Job = tuple[Case, str]


class Probes:
    """One drift probe per device, made on first use in the measuring process."""

    def __init__(self):
        self.by_device: dict[str, DriftProbe] = {}

    def for_jobs(self, jobs: list[Job]) -> DriftProbe | None:
        if not jobs:
            return None
        device = jobs[0][0].device
        if device not in self.by_device:
            self.by_device[device] = DriftProbe(device)
        return self.by_device[device]


def setup_process(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)
    configure_allocator()


def _worker_main(conn, threads: int | None) -> None:
    try:
        _serve(conn, threads)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: end quietly,
        pass  # the parent reports the interruption


def _serve(conn, threads: int | None) -> None:
    setup_process(threads)
    cache = CaseCache()
    probes = Probes()
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        if msg[0] == "ceilings":
            conn.send(measure_ceilings(*msg[1:]))
            continue
        _, jobs, budget, repeat = msg
        records = execute_group(jobs, budget, cache, probes.for_jobs(jobs),
                                progress=lambda: conn.send(("progress", None)), repeat=repeat)
        conn.send(("done", records))


class InProcessExecutor:
    """No isolation: fastest, but a crash ends the run and a hang is never cut short."""

    def __init__(self, threads: int | None = None):
        setup_process(threads)
        self.cache = CaseCache()
        self.probes = Probes()

    def run_group(self, jobs: list[Job], budget: TimingBudget, timeout_s: float
                  ) -> list[Record]:
        """Repeats (``budget.processes``) run in this same process: without isolation there
        is no fresh process to time them in."""
        share = budget.per_process()
        first = execute_group(jobs, share, self.cache, self.probes.for_jobs(jobs))
        repeats = [execute_group(jobs, share, self.cache, self.probes.for_jobs(jobs),
                                 repeat=True) for _ in range(budget.processes - 1)]
        return merge_repeats(first, repeats, budget)

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

    def run_group(self, jobs: list[Job], budget: TimingBudget, timeout_s: float
                  ) -> list[Record]:
        """Records of a group; after a crash or hang of a group of several, each job again
        on its own, so one bad kernel costs one record."""
        share = budget.per_process()
        status, result = self._send_group(jobs, share, timeout_s)
        if status == "done":
            repeats = []
            for _ in range(budget.processes - 1):  # the same group in fresh processes
                self.close()
                status, again = self._send_group(jobs, share, timeout_s, repeat=True)
                if status != "done":
                    break  # keep what the earlier processes measured
                repeats.append(again)
            return merge_repeats(result, repeats, budget)
        if len(jobs) > 1:
            return [r for job in jobs for r in self.run_group([job], budget, timeout_s)]
        case, backend = jobs[0]
        return [Record.new(case, backend, status, result)]

    def _send_group(self, jobs, budget, timeout_s: float, repeat: bool = False):
        if self.proc is None or not self.proc.is_alive():
            self._start()
        try:
            self.conn.send(("group", jobs, budget, repeat))
            while self.conn.poll(timeout_s):  # each heartbeat restarts the per-job limit
                kind, payload = self.conn.recv()
                if kind == "done":
                    return "done", payload
            self._stop(kill=True)
            return "timeout", f"no result within the {timeout_s:g} s limit; worker killed"
        except (EOFError, BrokenPipeError, ConnectionResetError):
            pass  # the worker died; its pipe closed before it answered
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
        return "crashed", f"worker process {how}"

    def close(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        self._stop()
