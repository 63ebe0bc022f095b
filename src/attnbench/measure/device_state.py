"""The device's state while a group was measured: clocks, power, temperature, throttle
reasons and energy, as record fields (the samplers of ``measure/samplers.py``).

- ``nvml`` (CUDA runs; the optional ``nvidia-ml-py``, ``pip install 'attnbench[gpu]'``): SM
  and memory clocks, power limit, temperature, throttle reasons by name, read at the start
  and end of a group, after its first timed call and then every SAMPLE_EVERY_S; energy
  from the total-energy counter, giving the group's mean power and ``energy_j`` per call.
- ``cpu`` (CPU runs): the mean core frequency from cpufreq or /proc/cpuinfo, and package
  energy from RAPL (powercap) where this user may read it.

A group is marked ``throttled`` when the SM clock fell by more than CLOCK_DROP_REL within it
or a throttle reason appeared. The CPU frequency is recorded but never marks a throttle: the
mean over cores falls whenever idle cores sleep. What cannot be read is said once per run
(``samplers.unavailable``, in meta.json), never per record.
"""

from __future__ import annotations

import os
import re
import statistics
import time
from pathlib import Path

import torch

from attnbench.measure import samplers

CLOCK_DROP_REL = 0.05  # an SM clock fall beyond this within a group marks it throttled
SAMPLE_EVERY_S = 0.2  # readings during a group, after a timed call, at most this often
NVML_MISSING = "nvidia-ml-py not installed: pip install 'attnbench[gpu]'"
NVML_COUNTER_WRAP = 2**64  # the total-energy counter is an unsigned 64-bit count of mJ

# NVML's clock event (throttle) reason bits, by name.
THROTTLE_BITS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
                 0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
                 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
                 0x100: "display_clock_setting"}
GPU_IDLE = 0x1
# The reasons that slow a kernel; idle, a user's clock setting or a sync boost do not.
THROTTLING = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
              "hw_power_brake_slowdown")

# Where the host's state is read: module attributes, so tests point them at fake trees.
CPU_SYS = Path("/sys/devices/system/cpu")
CPUINFO = Path("/proc/cpuinfo")
POWERCAP = Path("/sys/class/powercap")
clock = time.monotonic


def counter_delta(first: int, last: int, wrap: int) -> int:
    """How far a counter that wraps at ``wrap`` moved from ``first`` to ``last`` (one wrap
    at most between two readings)."""
    return last - first if last >= first else last + wrap - first


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


def clock_drop(readings: list[float]) -> float:
    """The largest fall of a clock from an earlier reading, relative to that reading (a rise,
    as when a group starts from idle, is no drop)."""
    top, drop = 0.0, 0.0
    for r in readings:
        top = max(top, r)
        if top > 0:
            drop = max(drop, (top - r) / top)
    return drop


def throttle_marks(sm_mhz: list[float], reasons: list[str]) -> list[str]:
    """Why a group counts as measured throttled ([] when it does not)."""
    marks = []
    drop = clock_drop(sm_mhz)
    if drop > CLOCK_DROP_REL:
        marks.append(f"sm clock fell {drop:.0%} ({max(sm_mhz):.0f} -> "
                     f"{min(sm_mhz[sm_mhz.index(max(sm_mhz)):]):.0f} MHz)")
    return marks + [r for r in reasons if r in THROTTLING]


def per_call_energy(joules: float, seconds: float, timings: list, source: str) -> list[dict]:
    """The group's mean power, and each closure's energy per call at that power over its
    median time (a call is charged the group's mean power: the counter is too coarse to
    read around one call)."""
    if seconds <= 0:
        return [{} for _ in timings]
    power = joules / seconds
    out = []
    for t in timings:
        cols = {"power_w": power, "energy_source": source}
        if t.samples_ms:
            cols["energy_j"] = power * statistics.median(t.samples_ms) / 1e3
        out.append(cols)
    return out


# ---- NVML --------------------------------------------------------------------------------


def load_nvml():
    """The pynvml module of nvidia-ml-py (ImportError when it is not installed)."""
    import pynvml

    return pynvml


def nvml_index(device: torch.device) -> int:
    """NVML counts every GPU of the machine; CUDA only the visible ones, in that order."""
    index = device.index or 0
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if v.strip()]
    if index < len(visible) and visible[index].isdigit():
        return int(visible[index])
    return index


class NvmlSampler:
    name = "nvml"

    def __init__(self, nvml, handle):
        self.nvml, self.handle = nvml, handle
        self.unreadable: dict[str, str] = {}
        self.energy = self._try_energy() is not None

    def _try_energy(self) -> int | None:
        try:
            return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except Exception as exc:  # pre-Volta GPUs have no energy counter
            self.unreadable["energy"] = f"NVML total energy: {type(exc).__name__}: {exc}"
            return None

    def _reasons(self) -> int:
        n = self.nvml
        get = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            n.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(get(self.handle))

    def read(self) -> dict:
        n, h = self.nvml, self.handle
        return {"sm": float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
                "mem": float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
                "temp": float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
                "reasons": self._reasons()}

    def snapshot(self) -> dict:
        r = self.read()
        out = {"gpu_sm_mhz": r["sm"], "gpu_mem_mhz": r["mem"], "gpu_temp_c": r["temp"],
               "gpu_throttle_reasons": reason_names(r["reasons"])}
        try:
            out["gpu_power_limit_w"] = self.nvml.nvmlDeviceGetEnforcedPowerLimit(
                self.handle) / 1e3
        except Exception:  # information only
            pass
        return out

    def begin(self) -> None:
        self.readings = [self.read()]
        self.t0 = clock()
        self.last = float("-inf")  # the first timed call is read: a short group has one too
        self.e0 = self._try_energy() if self.energy else None

    def per_call(self, index: int) -> None:
        now = clock()
        if now - self.last >= SAMPLE_EVERY_S:
            self.readings.append(self.read())
            self.last = now

    def end(self, timings: list) -> list[dict]:
        e1 = self._try_energy() if self.e0 is not None else None
        t1 = clock()
        self.readings.append(self.read())
        # Clocks read while the GPU was idle (before the first call, after the last sync)
        # are idle clocks, not throttled ones: the clock figures use the busy readings.
        busy = [r for r in self.readings if not r["reasons"] & GPU_IDLE] or self.readings
        sm = [r["sm"] for r in busy]
        mask = 0
        for r in self.readings:
            mask |= r["reasons"]
        reasons = reason_names(mask)
        group = {"gpu_sm_mhz": statistics.median(sm), "gpu_sm_mhz_min": min(sm),
                 "gpu_sm_mhz_max": max(sm),
                 "gpu_mem_mhz": statistics.median(r["mem"] for r in busy),
                 "gpu_temp_c": max(r["temp"] for r in self.readings),
                 "gpu_throttle_reasons": reasons, "throttled": throttle_marks(sm, reasons),
                 "device_readings": len(self.readings)}
        try:
            group["gpu_power_limit_w"] = self.nvml.nvmlDeviceGetEnforcedPowerLimit(
                self.handle) / 1e3
        except Exception:  # information only
            pass
        energy = [{} for _ in timings]
        if e1 is not None:
            joules = counter_delta(self.e0, e1, NVML_COUNTER_WRAP) / 1e3  # mJ
            energy = per_call_energy(joules, t1 - self.t0, timings, "nvml")
        return [group | e for e in energy]


def nvml_sampler(device) -> NvmlSampler | str | None:
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    try:
        nvml = load_nvml()
    except ImportError:
        return NVML_MISSING
    try:
        nvml.nvmlInit()
        handle = nvml.nvmlDeviceGetHandleByIndex(nvml_index(dev))
        sampler = NvmlSampler(nvml, handle)
        sampler.read()  # every field the sampler reads, once
    except Exception as exc:
        return f"NVML: {type(exc).__name__}: {exc}".splitlines()[0]
    return sampler


# ---- the host CPU ------------------------------------------------------------------------


def _read_number(path: Path) -> float | None:
    try:
        return float(path.read_text().strip())
    except (OSError, ValueError):
        return None


def cpu_mhz() -> tuple[float | None, str]:
    """The mean core frequency (MHz) and where it was read: cpufreq's scaling_cur_freq
    (kHz), else /proc/cpuinfo's 'cpu MHz' lines; (None, why) when neither is readable."""
    khz = [v for v in (_read_number(p) for p in
                       sorted(CPU_SYS.glob("cpu[0-9]*/cpufreq/scaling_cur_freq")))
           if v is not None]
    if khz:
        return statistics.fmean(khz) / 1e3, "cpufreq"
    try:
        mhz = [float(line.split(":", 1)[1]) for line in CPUINFO.read_text().splitlines()
               if line.startswith("cpu MHz")]
    except (OSError, ValueError):
        mhz = []
    if mhz:
        return statistics.fmean(mhz), "cpuinfo"
    return None, f"CPU frequency not readable here (no {CPU_SYS}/cpu*/cpufreq/" \
                 f"scaling_cur_freq, no 'cpu MHz' in {CPUINFO})"


def rapl_zones() -> tuple[list[tuple[Path, int]], str]:
    """The readable RAPL package zones (energy_uj, its wrap) and, when none, why. Sub-zones
    (core, uncore, dram) are left out: a package's count includes its cores'."""
    zones, why = [], ""
    for d in sorted(POWERCAP.glob("intel-rapl*")):
        if not re.fullmatch(r"intel-rapl:\d+", d.name):
            continue
        energy = _read_number(d / "energy_uj")
        wrap = _read_number(d / "max_energy_range_uj")
        if energy is None or wrap is None:
            why = why or f"{d}/energy_uj not readable by this user"
            continue
        zones.append((d / "energy_uj", int(wrap) + 1))
    if not zones and not why:
        why = f"no RAPL zone under {POWERCAP}"
    return zones, ("" if zones else f"CPU energy not readable here ({why})")


class CpuSampler:
    name = "cpu"

    def __init__(self, zones: list[tuple[Path, int]], unreadable: dict[str, str]):
        self.zones, self.unreadable = zones, unreadable

    def _energy(self) -> list[int] | None:
        values = [_read_number(p) for p, _ in self.zones]
        return None if not values or None in values else [int(v) for v in values]

    def snapshot(self) -> dict:
        mhz, source = cpu_mhz()
        return {"cpu_mhz": mhz, "cpu_mhz_source": source} if mhz else {}

    def begin(self) -> None:
        self.mhz0 = cpu_mhz()[0]
        self.e0 = self._energy()
        self.t0 = clock()

    def end(self, timings: list) -> list[dict]:
        e1, t1 = self._energy(), clock()
        group = {}
        if self.mhz0 is not None:
            group["cpu_mhz_begin"] = self.mhz0
        mhz1 = cpu_mhz()[0]
        if mhz1 is not None:
            group["cpu_mhz_end"] = mhz1
        energy = [{} for _ in timings]
        if self.e0 is not None and e1 is not None:
            uj = sum(counter_delta(a, b, wrap)
                     for a, b, (_, wrap) in zip(self.e0, e1, self.zones))
            energy = per_call_energy(uj / 1e6, t1 - self.t0, timings, "rapl")
        return [group | e for e in energy]


def cpu_sampler(device) -> CpuSampler | str | None:
    if torch.device(device).type != "cpu":
        return None
    mhz, source_or_why = cpu_mhz()
    zones, energy_why = rapl_zones()
    unreadable = {}
    if mhz is None:
        unreadable["frequency"] = source_or_why
    if energy_why:
        unreadable["energy"] = energy_why
    if mhz is None and not zones:
        return "; ".join(unreadable.values())
    return CpuSampler(zones, unreadable)


def tflops_per_j(fields: dict, work_flops: float | None) -> dict:
    """TFLOP of the backend's work per joule, where the record has its energy per call."""
    energy = fields.get("energy_j")
    if not energy or not work_flops:
        return {}
    return {"tflops_per_j": work_flops / 1e12 / energy}


def describe(device) -> dict:
    """For meta.json, once per run: which samplers run, what they cannot read and why, and
    the device's state at the start."""
    running = samplers.for_device(device)
    state = {}
    for s in running:
        try:
            state |= s.snapshot() if hasattr(s, "snapshot") else {}
        except Exception as exc:  # information only
            state[f"{s.name}_error"] = f"{type(exc).__name__}: {exc}"
    return {"sampled": [s.name for s in running], "not_readable": samplers.unavailable(device),
            "at_start": state}


samplers.register("nvml", nvml_sampler)
samplers.register("cpu", cpu_sampler)
