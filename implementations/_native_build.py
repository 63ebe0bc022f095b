"""Building a C++ extension so that nothing waits forever and nothing builds twice.

torch's extension builder guards a build with a ``lock`` file it creates and removes; a
process killed while building leaves that file, and every later load waits on it without
end. Here a build runs under an ``fcntl.flock`` on a file of our own in the extension's
folder: the kernel drops a flock when its holder dies, so a torch ``lock`` found while we
hold ours was left by a dead build and is removed. A finished build leaves a stamp naming
its library, which later processes import directly (no builder, no ninja, no lock); a
failed one leaves its reason, so no later process compiles it again until ``attnbench
build`` clears it.

The folder's name carries a hash of the sources, headers, flags, include paths, compiler,
Python and torch versions: one build per source and flag set, and two checkouts (whose
include paths differ) never share, so never rebuild, each other's folders.

Apart from the backends (``_native.py``) so that the tests drive it with a fake builder,
and without importing torch until a real build needs it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

STAMP = "attnbench-built.json"  # {"library": file name} once a build has finished
FAILED = "attnbench-failed.txt"  # why the last build failed
FLOCK = "attnbench-build.lock"  # our flock: held for the whole build
TORCH_LOCK = "lock"  # torch's FileBaton, in the folder it builds in
RETRY_HINT = "remembered from an earlier attempt; `attnbench build` tries again"


@dataclass(frozen=True)
class Spec:
    """One extension: what it is built from and how (tuples: nothing can append to them)."""

    name: str  # the kernel, e.g. "segment_attention"
    variant: str  # the build of it, e.g. "avx2"
    sources: tuple[Path, ...]
    headers: tuple[Path, ...] = ()
    cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    include_paths: tuple[str, ...] = ()

    def digest(self) -> str:
        h = hashlib.sha256()
        for path in (*self.sources, *self.headers):
            h.update(str(path).encode() + b"\0" + Path(path).read_bytes() + b"\0")
        for part in (self.cflags, self.ldflags, self.include_paths):
            h.update(json.dumps(list(part)).encode())
        h.update(json.dumps([os.environ.get("CXX", ""), sys.version_info[:2],
                             _torch_version()]).encode())
        return h.hexdigest()[:12]

    @property
    def ext_name(self) -> str:
        return f"attnbench_{self.name}_{self.variant}_{self.digest()}"


def _torch_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return ""


def root() -> Path:
    """Where extensions are built: torch's extension cache (``TORCH_EXTENSIONS_DIR``)."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    if env:
        return Path(env)
    from torch.utils.cpp_extension import get_default_build_root
    return Path(get_default_build_root())


def folder(spec: Spec) -> Path:
    return root() / spec.ext_name


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def import_file(path: Path):
    """The module in ``path`` (an extension library or a Python file), imported by path."""
    name = path.name.split(".")[0]  # torch names the library after the module
    found = importlib.util.spec_from_file_location(name, path)
    if found is None or found.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


def failed_reason(spec: Spec) -> str | None:
    """Why the last build of ``spec`` failed, or None when none did."""
    try:
        text = (folder(spec) / FAILED).read_text().strip()
    except OSError:
        return None
    return f"{text} ({RETRY_HINT})"


def built_library(spec: Spec) -> Path | None:
    """The library a finished build of ``spec`` left, or None."""
    try:
        library = folder(spec) / json.loads((folder(spec) / STAMP).read_text())["library"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return library if library.is_file() else None


def _write(path: Path, text: str) -> None:
    """Whole or not at all: a kill mid-write leaves no half stamp."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


@contextlib.contextmanager
def _flocked(where: Path, announce: Callable[[str], None]):
    where.mkdir(parents=True, exist_ok=True)
    fd = os.open(where / FLOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a live process is building: its build ends or it dies
            announce(f"waiting for another process building {where}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (closing drops the flock)


def first_error(exc: BaseException) -> str:
    """The compiler's first error line (torch's own "Error building extension" says
    nothing), else the first line naming an error, else the exception's last line."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for found in (lambda ln: "error:" in ln.lower(), lambda ln: "error" in ln.lower()):
        hit = next((ln for ln in lines if found(ln)), None)
        if hit:
            return hit
    return lines[-1] if lines else repr(exc)


Builder = Callable[[Spec, Path], object]


def torch_builder(spec: Spec, where: Path):
    """torch's extension builder in ``where``, on copies of the flags (it appends its own
    ``-L``/``-l`` to the ldflags list it is given)."""
    from torch.utils.cpp_extension import load as build
    return build(name=spec.ext_name, sources=[str(s) for s in spec.sources],
                 extra_cflags=list(spec.cflags), extra_ldflags=list(spec.ldflags),
                 extra_include_paths=list(spec.include_paths), build_directory=str(where),
                 verbose=False)


def load(spec: Spec, builder: Builder | None = None, retry: bool = False,
         announce: Callable[[str], None] = say):
    """(module, "") for ``spec``, built first (by ``builder``, default torch's) where no
    finished build exists, or (None, reason) where its build failed (now or, unless
    ``retry``, before). An interrupt (KeyboardInterrupt) propagates and records nothing:
    the next process builds again."""
    builder = builder or torch_builder
    if not retry:
        done = _finished(spec)
        if done is not None:
            return done
    where = folder(spec)
    with _flocked(where, announce):
        if not retry:
            done = _finished(spec)  # built (or failed) by the process we waited for
            if done is not None:
                return done
        stale = where / TORCH_LOCK
        if stale.exists():  # we hold the flock, so no live process is building here
            stale.unlink(missing_ok=True)
            announce(f"removed a stale build lock left by an interrupted build: {stale}")
        for name in (STAMP, FAILED):
            (where / name).unlink(missing_ok=True)
        try:
            module = builder(spec, where)
        except Exception as exc:  # a failed build is a reason to run eager, not a crash
            reason = f"{spec.sources[0].name} did not build: {first_error(exc)}"
            _write(where / FAILED, reason + "\n")
            return None, reason
        library = Path(module.__file__)
        _write(where / STAMP, json.dumps({"library": library.name, "spec": spec.ext_name}))
        return module, ""


def _finished(spec: Spec):
    reason = failed_reason(spec)
    if reason is not None:
        return None, reason
    library = built_library(spec)
    if library is None:
        return None
    try:
        return import_file(library), ""
    except ImportError:  # a damaged library: built again under the lock
        return None
