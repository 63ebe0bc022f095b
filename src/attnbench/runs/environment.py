"""What a measurement was taken on: device, libraries, CPU, threads, git state."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
from pathlib import Path

import torch


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_capability() -> str | None:
    """The SIMD level torch's CPU kernels dispatch to (avx2, avx512, ...; lower-case), which
    ATEN_CPU_CAPABILITY can lower. Inductor's CPU code and some kernels differ by it."""
    try:
        return str(torch.backends.cpu.get_cpu_capability()).lower()
    except Exception:  # older torch
        return None


def git_state(cwd: str | Path | None = None) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout the package runs from, or (None, None)."""
    where = Path(cwd) if cwd else Path(__file__).resolve().parent
    # Read only: `git status` would otherwise refresh the index and take .git/index.lock in
    # the user's checkout (racing their own git commands).
    git = ["git", "--no-optional-locks"]
    env = os.environ | {"GIT_OPTIONAL_LOCKS": "0"}
    try:
        commit = subprocess.run(git + ["rev-parse", "HEAD"], cwd=where, capture_output=True,
                                text=True, timeout=10, check=True, env=env).stdout.strip()
        status = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"],
                                cwd=where, capture_output=True, text=True, timeout=10,
                                check=True, env=env).stdout
        return commit, bool(status.strip())
    except (OSError, subprocess.SubprocessError):
        return None, None


def device_name(device: str) -> str:
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return cpu_model()


def collect(device: str) -> dict:
    dev = torch.device(device)
    commit, dirty = git_state()
    env = {
        "device": dev.type,
        "device_name": device_name(device),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "xformers": _version("xformers"),
        "numpy": _version("numpy"),
        "attnbench": _version("attnbench"),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_capability": cpu_capability(),
        "threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
        "git_commit": commit,
        "git_dirty": dirty,
        "cuda": torch.version.cuda,
        "driver": None,
        "gpu_capability": None,
    }
    if dev.type == "cuda":
        env["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(dev)))
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                                  "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=10)
            env["driver"] = out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
        except (OSError, subprocess.SubprocessError):
            pass
    env["device_state"] = _device_state(device)
    return env


def _device_state(device: str) -> dict:
    """Which device-state samplers run, what is not readable here (said once per run, not
    per record), and the state at the start (measure/device_state.py)."""
    from attnbench.measure import device_state

    try:
        return device_state.describe(device)
    except Exception as exc:  # information only: never costs the run
        return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}


def timing_note(method: str, device: str) -> dict:
    """The run's ``timing`` entries beside the suite's table: on a CPU a GPU method does not
    apply, and meta.json says so once (never per record)."""
    from attnbench.measure import timing_methods

    note = timing_methods.cpu_note(method, device)
    return {"method_note": note} if note else {}


# What makes two environments different for measuring: not the host name or the dirty flag.
ID_FIELDS = ("device_name", "cpu_capability", "threads", "torch", "triton", "xformers",
             "numpy", "cuda", "driver", "git_commit", "omp_wait_policy")


def env_id(env: dict) -> str:
    """Short stable hash of the fields that decide a measurement's environment."""
    text = json.dumps({k: env.get(k) for k in ID_FIELDS}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# The few environment fields copied into every record, so a row stands on its own.
RECORD_FIELDS = ("device_name", "cpu_capability", "torch", "triton", "git_commit", "threads")


def record_fields(env: dict) -> dict:
    return {f"env_{k}": env.get(k) for k in RECORD_FIELDS}
