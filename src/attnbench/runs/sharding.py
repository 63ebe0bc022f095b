"""One run's (case, backend) pairs spread over the ranks torchrun starts.

``torchrun --nproc-per-node N -m attnbench run ...`` starts N copies of the command with
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` set (and ``MASTER_ADDR`` /
``MASTER_PORT`` for the rendezvous). Each rank:

* measures on its own device: ``cuda:LOCAL_RANK`` (made current, and the only GPU its worker
  process sees), or on CPU its own slice of the cores with cores // LOCAL_WORLD_SIZE threads;
* runs its share of the pairs: the groups timed together in interleaved rounds
  (``pairing.job_groups``) are never split, so a ratio between them comes from one device;
  groups go, costliest first, to the least loaded rank (``plan.pair_cost_s``), the same
  assignment on every rank, computed from the same pending pairs;
* writes its own records file under the run folder (``rankdirs``); rank 0, the lead, created
  the folder and holds its lock, and merges the ranks' files once every rank is done.

torch.distributed (gloo) carries only what needs it: the run folder's name from the lead
(or the lead's one-line refusal) and a barrier before the merge. Without torchrun
(``WORLD_SIZE`` unset or 1) nothing here runs.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnbench.core.case import Case
from attnbench.core.errors import BadInput, PeerLost
from attnbench.runs.pairing import job_groups
from attnbench.runs.plan import pair_cost_s
from attnbench.runs.suite import Suite

Job = tuple[Case, str]
# A rank that finished its share waits at the barrier for the slowest one; sweeps run hours.
COLLECTIVE_TIMEOUT = dt.timedelta(days=7)


def _int_env(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text in (None, ""):
        return default
    try:
        return int(text)
    except ValueError:
        raise BadInput(f"environment variable {name}={text!r}: allowed: an integer, as "
                       f"torchrun sets it") from None


def is_lead() -> bool:
    """True unless this process is a rank other than 0 of a torchrun launch."""
    return _int_env("WORLD_SIZE", 1) <= 1 or _int_env("RANK", 0) == 0


@dataclass
class Shard:
    """This process's place in a torchrun launch."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    started: str = field(default_factory=lambda: dt.datetime.now().astimezone().isoformat())
    device: str = ""  # the physical device this rank measures on, once bound
    cpu_affinity: list[int] | None = None

    @classmethod
    def from_env(cls) -> Shard | None:
        world = _int_env("WORLD_SIZE", 1)
        if world <= 1:
            return None
        rank = _int_env("RANK", 0)
        local_world = _int_env("LOCAL_WORLD_SIZE", world)
        local_rank = _int_env("LOCAL_RANK", rank)
        if not (0 <= rank < world and 0 <= local_rank < local_world):
            raise BadInput(f"RANK={rank}, LOCAL_RANK={local_rank} with WORLD_SIZE={world}, "
                           f"LOCAL_WORLD_SIZE={local_world}: allowed: ranks below the sizes, "
                           f"as torchrun sets them")
        return cls(rank, world, local_rank, local_world)

    @property
    def lead(self) -> bool:
        return self.rank == 0

    # ---- device ----------------------------------------------------------------------

    def bind(self, device: str) -> str:
        """Claim this rank's device and return the device cases name (``cuda`` or ``cpu``:
        case keys must not depend on the rank, or a resume elsewhere would not find them)."""
        kind = torch.device(device).type
        if kind == "cuda":
            if torch.device(device).index is not None:
                raise BadInput(f"--device {device}: under torchrun each rank measures on "
                               f"cuda:LOCAL_RANK; allowed: --device cuda or auto")
            count = torch.cuda.device_count()
            if self.local_rank >= count:
                raise BadInput(f"LOCAL_RANK={self.local_rank}: this node has {count} CUDA "
                               f"device(s); allowed: --nproc-per-node {count} or fewer")
            torch.cuda.set_device(self.local_rank)
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            ids = [x.strip() for x in visible.split(",")] if visible else [
                str(i) for i in range(count)]
            # the isolated worker is a fresh process: it sees this rank's GPU only (as cuda:0)
            os.environ["CUDA_VISIBLE_DEVICES"] = ids[self.local_rank]
            self.device = f"cuda:{self.local_rank} (CUDA_VISIBLE_DEVICES {ids[self.local_rank]})"
            return "cuda"
        cores = sorted(os.sched_getaffinity(0))
        share = len(cores) // self.local_world
        if share >= 1:  # ranks on one node measure on disjoint cores
            self.cpu_affinity = cores[self.local_rank * share:(self.local_rank + 1) * share]
            os.sched_setaffinity(0, self.cpu_affinity)
        torch.set_num_threads(max(1, share))
        self.device = "cpu" + (f" (cores {','.join(map(str, self.cpu_affinity))})"
                               if self.cpu_affinity else "")
        return "cpu"

    def describe(self) -> dict:
        return {"rank": self.rank, "world_size": self.world, "local_rank": self.local_rank,
                "local_world_size": self.local_world, "host": socket.gethostname(),
                "pid": os.getpid(), "device": self.device, "cpu_affinity": self.cpu_affinity,
                "started": self.started}

    # ---- the pairs -------------------------------------------------------------------

    def share(self, todo: list[Job], suite: Suite) -> list[Job]:
        """This rank's pending pairs, in the suite's order."""
        groups = job_groups(todo, suite.claims, suite.comparisons)
        owners = assign([group_cost(g, suite) for g in groups], self.world)
        mine = {(c.key, b) for g, r in zip(groups, owners) if r == self.rank for c, b in g}
        return [(c, b) for c, b in todo if (c.key, b) in mine]

    # ---- collectives -----------------------------------------------------------------

    def _group(self):
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo", rank=self.rank, world_size=self.world,
                                    timeout=COLLECTIVE_TIMEOUT)
        return dist

    def agree(self, open_run, root: Path) -> Path:
        """The lead opens the run folder (``open_run()``: create or resume, lock, fold what
        an earlier attempt left); every rank gets its name, or the lead's refusal."""
        dist = self._group()
        box: list = [None]
        error = None
        if self.lead:
            try:
                box = [("ok", open_run().name)]
            except BadInput as exc:
                error = exc
                box = [("error", str(exc))]
        dist.broadcast_object_list(box, src=0)
        kind, value = box[0]
        if error is not None:
            raise error
        if kind == "error":
            raise BadInput(value)
        run_dir = Path(root) / value
        if not run_dir.is_dir():
            raise BadInput(f"{run_dir}: the run folder rank 0 created is not visible on this "
                           f"node; allowed: an --out folder every node shares")
        return run_dir

    def barrier(self, run_dir: Path) -> None:
        try:
            self._group().barrier()
        except RuntimeError as exc:  # gloo: the connection to a dead rank closed
            said = re.sub(r"^\[[^\]]*\]\s*", "", str(exc)).split(". ")[0][:120]
            raise PeerLost(f"rank {self.rank}: another rank ended before the merge "
                           f"(gloo: {said}); the records of every rank "
                           f"are kept: attnbench run --resume {run_dir.name} --out "
                           f"{run_dir.parent} completes the run, with any number of "
                           f"ranks") from None

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def group_cost(group: list[Job], suite: Suite) -> float:
    """Estimated seconds of a group: its pairs' costs at the suite's budgets and their work
    (interleaved rounds time every member, so the group costs their sum)."""
    from attnbench.core.registry import all_backends

    backends = all_backends()
    total = 0.0
    for case, name in group:
        backend = backends.get(name)
        try:
            work = backend.work_flops(case) if backend is not None else None
        except Exception:  # a backend's own count failing must not stop the assignment
            work = None
        total += pair_cost_s(case, suite.timing, work)
    return total


def assign(costs: list[float], world: int) -> list[int]:
    """The rank of each group: costliest first (ties: the earlier group) to the least loaded
    rank (ties: the lower rank). Deterministic: every rank computes the same answer."""
    load = [0.0] * world
    owner = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += costs[i]
    return owner
