"""Run folders: safe names, exclusive creation, and a lock while a run writes.

Suite names and run ids become path components, so they are checked (run ids) or turned
into slugs (suite names in default run ids): nothing is ever written outside ``--out``.
A new run creates its folder exclusively, so two runs started in the same second get two
folders; a run holds an advisory lock on ``.lock`` while it writes, so a second writer
(say a ``--resume`` of a run still going) is refused instead of interleaving records.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
from pathlib import Path

from attnbench.core.errors import BadInput

MAX_NAME = 100
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def slug(text: str, limit: int = 60) -> str:
    """A safe path component from any text (letters, digits, '.', '_', '-')."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip(".-_")
    return (s[:limit].rstrip(".-_")) or "run"


def check_name(name: str, what: str = "--run-id") -> str:
    """A run id or report name given by the user: refused unless it is a safe component."""
    if not isinstance(name, str) or not _SAFE.match(name) or len(name) > MAX_NAME:
        raise BadInput(f"{what} {name!r}: allowed: up to {MAX_NAME} letters, digits, '.', "
                       f"'_' or '-', starting with a letter or digit")
    return name


def out_root(out: str | Path) -> Path:
    """The results root: a directory (made if missing), never a file."""
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise BadInput(f"--out {out}: is a file; allowed: a directory (made if missing)")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"--out {out}: cannot create it ({exc.strerror}); allowed: a "
                       f"writable directory") from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise BadInput(f"--out {out}: not writable; allowed: a writable directory")
    return root


def new_run_dir(root: Path, run_id: str, explicit: bool) -> Path:
    """Create the folder of a new run exclusively. An explicit id that exists is refused;
    a default (timestamped) one gets a suffix: -2, -3, ..."""
    for n in range(1, 1000):
        name = run_id if n == 1 else f"{run_id}-{n}"
        path = root / name
        try:
            path.mkdir()
            return path
        except FileExistsError:
            if explicit:
                if not any(path.iterdir()):  # an empty folder left by an aborted start
                    return path
                raise BadInput(f"{path}: run directory already exists; pass --resume "
                               f"{run_id} to continue it or choose another --run-id") from None
        except OSError as exc:
            raise BadInput(f"{path}: cannot create the run directory ({exc.strerror})") from None
    raise BadInput(f"{root / run_id}: too many runs with this id")


class RunLock:
    """An advisory lock on ``run_dir/.lock`` for as long as a run writes to the folder."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / ".lock"
        self.fh = None

    def __enter__(self) -> RunLock:
        self.fh = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            self.fh.seek(0)
            holder = self.fh.read().strip() or "another process"
            self.fh.close()
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise BadInput(f"{self.path.parent}: a run is writing to it (pid {holder}); "
                               f"wait for it to end") from None
            raise
        self.fh.seek(0)
        self.fh.truncate()
        self.fh.write(str(os.getpid()))
        self.fh.flush()
        return self

    def __exit__(self, *exc) -> None:
        if self.fh is not None:
            fcntl.flock(self.fh, fcntl.LOCK_UN)
            self.fh.close()
