"""Isolation: jobs run in a child process, so a crash or a hang costs one record, not the run.

The parent sends a job group (the (case, backend) pairs timed together) over a pipe and
waits for each heartbeat (one per job set up, one after the group's timing) and then the
records. Each heartbeat names the phase the worker enters, and the wait is that phase's
bound: ``timing.setup_timeout_s`` for setup (the worker's start, inputs, reference,
prepare, compile), the suite's ``timeout_s`` for the timed work. A child that dies yields
``crashed`` (with its exit code or signal); one that does not answer in time is killed and
yields ``timeout``, whose reason names the bound that ran out. Either way a fresh child
takes the next job; a group that crashed or hung is rerun one job at a time, so only the
guilty job's record says so.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import re
import resource
import signal
import sys
from dataclasses import dataclass

import torch

from attnbench.core.case import Case
from attnbench.core.record import Record
from attnbench.measure.ceilings import measure_ceilings
from attnbench.measure.claim_rounds import ClaimRounds
from attnbench.measure.execute import (
    SETUP,
    CaseCache,
    claim_settled,
    execute_group,
    merge_repeats,
)
from attnbench.measure.memory import configure_allocator, settle_garbage
from attnbench.measure.probe import DriftProbe
from attnbench.measure.timing import TimingBudget

Job = tuple[Case, str]
CEILINGS_TIMEOUT_S = 600


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


# worker.log past LOG_LIMIT bytes is cut to its last LOG_KEEP between groups
LOG_LIMIT = 8 * 2**20
LOG_KEEP = 2**20
# Triton's bindings at interpreter exit: not a worker's last words worth quoting
NANOBIND_NOISE = re.compile(r"^(nanobind: |- leaked |See https://nanobind)")


@dataclass(frozen=True)
class WorkerConfig:
    threads: int | None = None
    max_memory_bytes: int | None = None  # RLIMIT_AS of the worker: beyond it, ``oom``
    log_path: str | None = None  # the worker's stdout and stderr go here (crash reasons)
    profile_dir: str | None = None  # the run directory: profile each ok pair (profiling.py)


def _redirect_output(path: str) -> None:
    """Backends' prints and the worker's dying words go to the run's worker.log, not the
    user's terminal; a crashed record quotes the last lines."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


class GlobalState:
    """torch's process-wide settings a backend might change (threads, default dtype,
    deterministic algorithms, grad mode): saved once, restored after every group, so no
    later record is measured under another backend's settings."""

    def __init__(self):
        self.threads = torch.get_num_threads()
        self.dtype = torch.get_default_dtype()
        self.deterministic = torch.are_deterministic_algorithms_enabled()
        self.grad = torch.is_grad_enabled()

    def restore(self) -> None:
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        if torch.get_default_dtype() != self.dtype:
            torch.set_default_dtype(self.dtype)
        if torch.are_deterministic_algorithms_enabled() != self.deterministic:
            torch.use_deterministic_algorithms(self.deterministic)
        torch.set_grad_enabled(self.grad)


def _worker_main(conn, config: WorkerConfig) -> None:
    if config.log_path:
        _redirect_output(config.log_path)
    if config.max_memory_bytes:  # the soft limit: lifted while the ceilings are measured
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        resource.setrlimit(resource.RLIMIT_AS, (config.max_memory_bytes, hard))
    try:
        _serve(conn, config.threads, config.profile_dir)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: end quietly,
        pass  # the parent reports the interruption
    # Done: leave without the interpreter's teardown, where Triton's nanobind bindings print
    # "nanobind: leaked N instances!" blocks into worker.log on every exit. Nothing is left
    # to tear down: every record went over the pipe, and the output is flushed here.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@contextlib.contextmanager
def _uncapped():
    """The address-space cap (--max-memory) lifted to its hard limit, then put back."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _serve(conn, threads: int | None, profile_dir: str | None = None) -> None:
    setup_process(threads)
    state = GlobalState()
    cache = CaseCache()
    probes = Probes()
    with contextlib.suppress(ImportError):  # the timing's intervals need it: load it now,
        import scipy.stats  # noqa: F401  (in the worker's start, not in a pair's timing)
    conn.send(("ready", None))  # start-up (importing torch) is not a pair's time
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        if msg[0] == "call":  # a correctness task (measure/correctness.py), as isolated
            conn.send(("done", msg[1](*msg[2])))
            continue
        if msg[0] == "ceilings":
            with _uncapped():  # the device's ceilings, not a pair: --max-memory is for pairs
                ceilings = measure_ceilings(*msg[1:])
            conn.send(ceilings)
            continue
        _, jobs, budget, repeat, claim, prior, until = msg
        def progress(phase: str):  # after each job's setup and after timing
            state.restore()
            conn.send(("progress", phase))

        records = execute_group(jobs, budget, cache, probes.for_jobs(jobs), progress=progress,
                                repeat=repeat, profile_dir=profile_dir, claim=claim,
                                prior=prior, until=until)
        settle_garbage()
        state.restore()
        for rec in records:
            rec.update(worker_pid=os.getpid())
        conn.send(("done", records))
        if any(rec.info.get("context_lost") for rec in records):
            return  # a poisoned CUDA context: the parent starts a fresh worker


def processes_for(budget: TimingBudget, claim: ClaimRounds | None) -> int:
    """How many processes a group may be timed in (a sequential claim's: one per look at
    most, and fewer when it is settled early)."""
    return claim.processes(budget.processes) if claim else budget.processes


def pooled_samples(processes: list[list[Record]]) -> list[list[float]] | None:
    """Each job's samples over the processes so far (round-aligned), for the next one's
    sequential rule; None before the first."""
    if not processes:
        return None
    return [[x for recs in processes for x in recs[i].info.get("samples_ms", [])]
            for i in range(len(processes[0]))]


class InProcessExecutor:
    """No isolation: fastest, but a crash ends the run and a hang is never cut short."""

    def __init__(self, threads: int | None = None, config: WorkerConfig | None = None):
        setup_process(threads)
        self.cache = CaseCache()
        self.probes = Probes()
        self.profile_dir = config.profile_dir if config else None

    def run_group(self, jobs: list[Job], budget: TimingBudget, timeout_s: float,
                  claim: ClaimRounds | None = None) -> list[Record]:
        """Repeats (``budget.processes``) run in this same process: without isolation there
        is no fresh process to time them in."""
        share = budget.per_process()
        done: list[list[Record]] = []
        for i in range(processes_for(budget, claim)):
            if claim is not None and done and claim_settled(done[-1]):
                break
            done.append(execute_group(jobs, share, self.cache, self.probes.for_jobs(jobs),
                                      profile_dir=None if done else self.profile_dir,
                                      repeat=bool(done), claim=claim,
                                      prior=pooled_samples(done),
                                      until=claim and claim.share_end(i, budget.processes)))
        settle_garbage()
        return merge_repeats(done[0], done[1:], budget)

    def ceilings(self, dtypes: list[str], device: str) -> dict:
        return measure_ceilings(dtypes, device)

    def close(self) -> None:
        pass


def run_in_fresh_process(target, args: tuple) -> int:
    """``target(*args)`` in a fresh spawned process, waited for; its exit code. Unlike a
    worker it has no pipe and no time limit, and it may start processes of its own."""
    child = mp.get_context("spawn").Process(target=target, args=args)
    child.start()
    child.join()
    return child.exitcode


def setup_ran_out(what: str, limit_s: float) -> str:
    """A ``timeout`` record's reason when setup, not the timed work, took too long."""
    return (f"setup ({what}) took longer than its {limit_s:g} s limit "
            f"(timing.setup_timeout_s); worker killed")


class IsolatedExecutor:
    def __init__(self, threads: int | None = None, config: WorkerConfig | None = None):
        self.config = config or WorkerConfig(threads)
        self.ctx = mp.get_context("spawn")
        self.proc = None
        self.conn = None
        self.log_offset = 0

    def _start(self, limit_s: float) -> bool:
        """A fresh worker; False (and none) when it did not report ready within
        ``limit_s``."""
        parent, child = self.ctx.Pipe()
        log = self.config.log_path
        self.log_offset = os.path.getsize(log) if log and os.path.exists(log) else 0
        self.proc = self.ctx.Process(target=_worker_main, args=(child, self.config),
                                     daemon=True)
        self.proc.start()
        child.close()
        self.conn = parent
        try:  # a pair's timeout starts once the worker is up, however loaded the machine
            if self.conn.poll(limit_s):
                self.conn.recv()  # ("ready", None)
                return True
        except (EOFError, ConnectionResetError):
            return True  # it died starting: the first send or receive says so
        self._stop(kill=True)
        return False

    def last_output(self, lines: int = 3) -> str:
        """The last lines the current worker wrote (its log since it started)."""
        log = self.config.log_path
        if not log or not os.path.exists(log):
            return ""
        with open(log, "rb") as fh:
            fh.seek(self.log_offset)
            text = fh.read()[-4096:].decode("utf-8", "replace")
        tail = [x.strip() for x in text.splitlines() if x.strip()
                and not NANOBIND_NOISE.match(x.strip())][-lines:]
        return " | ".join(tail)

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
        if (self.proc is None or not self.proc.is_alive()) and \
                not self._start(CEILINGS_TIMEOUT_S):
            return {"error": f"ceilings not measured: the worker did not start within "
                             f"{CEILINGS_TIMEOUT_S} s"}
        try:
            self.conn.send(("ceilings", dtypes, device))
            if self.conn.poll(CEILINGS_TIMEOUT_S):
                return self.conn.recv()
            self._stop(kill=True)
            why = f"no answer within {CEILINGS_TIMEOUT_S} s"
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self._stop()
            why = f"the worker died ({self.last_output() or 'no output'})"
        # a crash costs the ceilings, not the run: records go without their fractions
        return {"error": f"ceilings not measured: {why}"}

    def run_group(self, jobs: list[Job], budget: TimingBudget, timeout_s: float,
                  claim: ClaimRounds | None = None) -> list[Record]:
        """Records of a group; after a crash or hang of a group of several, each job again
        on its own, so one bad kernel costs one record. ``claim``: the group holds a
        sequential claim's sides (its rounds go on until it is decided)."""
        share = budget.per_process()
        share_end = (lambda i: claim.share_end(i, budget.processes)) if claim else \
            (lambda i: None)
        status, result = self._send_group(jobs, share, timeout_s, claim=claim,
                                          until=share_end(0))
        if status == "done":
            repeats = []
            for i in range(1, processes_for(budget, claim)):  # in fresh processes
                if claim is not None and claim_settled(repeats[-1] if repeats else result):
                    break
                self.close()
                status, again = self._send_group(jobs, share, timeout_s, repeat=True,
                                                 claim=claim,
                                                 prior=pooled_samples([result, *repeats]),
                                                 until=share_end(i))
                if status != "done":
                    break  # keep what the earlier processes measured
                repeats.append(again)
            return merge_repeats(result, repeats, budget)
        if len(jobs) > 1:  # said on every record: their rounds are no longer shared
            why = f"its group of {len(jobs)} {status}: {result}"
            return [r if "timed_alone" in r.info else r.update(timed_alone=why)
                    for job in jobs for r in self.run_group([job], budget, timeout_s)]
        case, backend = jobs[0]
        return [Record.new(case, backend, status, result)]

    def _trim_log(self) -> None:
        """Between groups (the worker idle), cut a log past LOG_LIMIT to its last LOG_KEEP
        bytes: a chatty backend cannot fill the disk. The worker appends (O_APPEND), so its
        next lines land after what is kept."""
        log = self.config.log_path
        try:
            size = os.path.getsize(log) if log else 0
        except OSError:
            return
        if size <= LOG_LIMIT:
            return
        with open(log, "rb") as fh:
            fh.seek(size - LOG_KEEP)
            tail = fh.read()
        note = (f"[attnbench: {size - len(tail)} earlier bytes of worker output dropped; "
                f"this log keeps its last {LOG_KEEP} bytes]\n").encode()
        with open(log, "r+b") as fh:
            fh.write(note + tail)
            fh.truncate()
        self.log_offset = max(len(note), self.log_offset - (size - len(tail)) + len(note))

    def _send_group(self, jobs, budget, timeout_s: float, repeat: bool = False,
                    claim: ClaimRounds | None = None, prior=None, until=None):
        status, payload = self._exchange(("group", jobs, budget, repeat, claim, prior, until),
                                         timeout_s, budget.setup_timeout_s)
        if status == "done" and any(rec.info.get("context_lost") for rec in payload):
            self._stop()  # the worker has ended; the next group gets a new one
        return status, payload

    def call(self, fn, args: tuple, timeout_s: float):
        """``fn(*args)`` in the worker, isolated as a group is (the correctness harness's
        tasks; ``fn`` must not raise): ("done", its value), ("crashed" or "timeout", why)."""
        return self._exchange(("call", fn, args), timeout_s, timeout_s)

    def _exchange(self, msg: tuple, timeout_s: float, setup_timeout_s: float):
        self._trim_log()
        if (self.proc is None or not self.proc.is_alive()) and \
                not self._start(setup_timeout_s):
            return "timeout", setup_ran_out("the worker's start", setup_timeout_s)
        try:
            self.conn.send(msg)
            phase = SETUP
            # each heartbeat restarts the limit, the bound of the phase it announces
            while self.conn.poll(setup_timeout_s if phase == SETUP else timeout_s):
                kind, payload = self.conn.recv()
                if kind == "done":
                    return "done", payload
                phase = payload
            self._stop(kill=True)
            if phase == SETUP:
                return "timeout", setup_ran_out("inputs, reference, prepare and compile",
                                                setup_timeout_s)
            return "timeout", (f"the timed work gave no result within the {timeout_s:g} s "
                               f"limit (timeout_s); worker killed")
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
        said = self.last_output()
        return "crashed", f"worker process {how}" + (f"; its last output: {said}"
                                                       if said else "")

    def kill(self) -> None:
        """The worker killed now, without waiting for it (a caller that is stopping)."""
        proc = self.proc
        if proc is not None and proc.is_alive():
            proc.kill()

    def close(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        self._stop()
