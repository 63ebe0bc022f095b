"""A fake slow extension build, run as a process that
tests/implementations/test_native_build.py kills.

``python slow_builder.py EXT_DIR WORK PAUSE_AT``: loads the extension of WORK/fake.cpp
through ``_native_build.load`` with a builder that behaves as torch's does: it takes torch's
real ``lock`` file (``FileBaton``; waits on it where it exists), builds for BUILD_S seconds
(the "library" is a Python file), and releases the lock in a ``finally``. At each moment
(before, held, written) it appends the moment's name to WORK/moments; at PAUSE_AT it waits
there to be killed. Prints "VALUE 42" once the module is loaded.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time
from pathlib import Path

BUILD_S = 1.0


def file_baton():
    """torch's FileBaton, loaded by path: its module needs only the standard library, so
    this process starts without importing torch."""
    torch_dir = Path(importlib.util.find_spec("torch").submodule_search_locations[0])
    spec = importlib.util.spec_from_file_location("file_baton", torch_dir / "utils" /
                                                  "file_baton.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FileBaton


def main(ext_dir: str, work: str, pause_at: str) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C: KeyboardInterrupt
    os.environ["TORCH_EXTENSIONS_DIR"] = ext_dir
    from attnbench.implementations import _native_build as nb

    work_dir = Path(work)
    baton_class = file_baton()

    def moment(name: str) -> None:
        with open(work_dir / "moments", "a") as fh:
            fh.write(name + "\n")
        if name == pause_at:
            time.sleep(3600)  # killed here

    def builder(spec, where: Path):
        library = where / f"{spec.ext_name}.py"
        moment("before")
        baton = baton_class(str(where / nb.TORCH_LOCK))
        if baton.try_acquire():
            try:
                moment("held")
                time.sleep(BUILD_S)
                library.write_text("VALUE = 42\n")
                moment("written")
            finally:
                baton.release()
        else:
            baton.wait()  # torch's wait: forever, where the lock's holder is dead
        return nb.import_file(library)

    spec = nb.Spec("fake", "test", sources=(work_dir / "fake.cpp",), cflags=("-O3",))
    module, reason = nb.load(spec, builder=builder)
    print("VALUE", module.VALUE if module is not None else reason, flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
