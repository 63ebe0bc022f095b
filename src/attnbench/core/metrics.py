"""Every metric a record carries, declared once: unit, direction, format, report section, and
how it is obtained. Tables, the report, compare, claims, the CSV's column order and the
column list in docs/records.md all read these declarations (``python -m
attnbench.core.metrics`` prints the table); adding a metric is one declaration here plus
its measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LOWER, HIGHER, NEUTRAL = "lower", "higher", "neutral"
TENSORS = ("out", "dq", "dk", "dv")


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str  # of the stored value
    better: str  # LOWER, HIGHER or NEUTRAL (a count or a context figure)
    how: str  # how it is measured or derived
    section: str = ""  # the report section that tabulates it ("" = not tabulated)
    sig: int = 3  # significant figures in tables
    display_scale: float = 1.0  # stored value * display_scale is shown ...
    display_unit: str = ""  # ... in this unit (default: unit)
    percent: bool = False  # shown as a percentage
    per_time: bool = False  # a fixed amount over the median time: its interval is the time's

    @property
    def shown_unit(self) -> str:
        return "%" if self.percent else (self.display_unit or self.unit)

    @property
    def heading(self) -> str:
        """The section with its unit, once: "Median time (ms)", but "Throughput (TFLOP/s of
        the work each backend performs)" as it stands."""
        unit = self.shown_unit
        return self.section if unit in self.section else f"{self.section} ({unit})"

    def format(self, value) -> str:
        """The value as a table shows it, without its unit ('' when missing)."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return ""
        if isinstance(value, str):
            return value
        v = float(value) * self.display_scale
        if self.percent:
            return f"{v * 100:.{max(self.sig - 2, 0)}f}%" if abs(v) >= 0.1 else f"{v:.1%}"
        if self.unit == "count":
            return f"{int(v)}"
        return f"{v:.{self.sig}g}"

    def worse(self, ratio_new_over_base: float, threshold: float) -> bool:
        """Whether new/base moved beyond the threshold in the bad direction."""
        if self.better == LOWER:
            return ratio_new_over_base > 1 + threshold
        if self.better == HIGHER:
            return ratio_new_over_base < 1 - threshold
        return False


def _errors() -> list[Metric]:
    out = []
    for prefix, what, section in (
            ("err_impl", "the float64 evaluation of the function the backend claims to "
                         "compute", "Error against its float64 evaluation"),
            ("err_vs_softmax", "exact softmax attention of the case (approximation error)",
             "Approximation error against exact softmax")):
        for t in TENSORS:
            out.append(Metric(f"{prefix}_{t}_maxabs", "1", LOWER,
                              f"max |{t} - float64 {t}| against {what}", sig=2))
            out.append(Metric(f"{prefix}_{t}_rel", "1", LOWER,
                              f"relative L2 ||{t} - ref|| / ||ref|| against {what}",
                              section=section if t == "out" else "", sig=2))
    for t in TENSORS:  # a packed batch (lengths): its worst document
        out.append(Metric(f"err_doc_{t}_rel", "1", LOWER,
                          f"packed batch: the largest relative L2 error of {t} over its "
                          f"documents, each against its own float64 evaluation "
                          f"(err_doc_{t}_row, err_doc_{t}_doc say which)",
                          section="Error of the worst document against its float64 "
                                  "evaluation" if t == "out" else "", sig=2))
        out.append(Metric(f"err_doc_{t}_len", "tokens", NEUTRAL,
                          f"packed batch: tokens of the document with the largest {t} error",
                          section="Length of the worst document" if t == "out" else "",
                          sig=6))
    return out


METRICS: tuple[Metric, ...] = (
    Metric("time_ms_median", "ms", LOWER, "median of the timed samples (CPU perf_counter; "
           "GPU CUDA events, L2 flushed)", section="Median time", sig=4),
    Metric("time_ms_ci_low", "ms", LOWER, "lower end of the 95% interval of the median "
           "(order statistics of the samples)", sig=4),
    Metric("time_ms_ci_high", "ms", LOWER, "upper end of the 95% interval of the median",
           sig=4),
    Metric("time_ci_confidence", "1", NEUTRAL, "confidence the interval reaches (below 0.95 "
           "with fewer than 6 samples)", sig=3),
    Metric("time_ms_iqr", "ms", LOWER, "interquartile range of the samples", sig=3),
    Metric("time_ms_min", "ms", LOWER, "fastest sample", sig=4),
    Metric("time_cv", "1", LOWER, "coefficient of variation (stdev / mean) of the samples",
           sig=2),
    Metric("n_samples", "count", NEUTRAL, "timed samples kept (adaptive: until the interval "
           "is narrow enough or the budget is spent)"),
    Metric("tflops", "TFLOP/s", HIGHER, "work the backend performs (its work_flops) / median "
           "time", section="Throughput (TFLOP/s of the work each backend performs)",
           per_time=True),
    Metric("tflops_dense", "TFLOP/s", HIGHER, "dense-equivalent rate: all Nq x Nk pairs "
           "counted, whatever the backend computes (a common axis for approximations)",
           per_time=True),
    Metric("gbps", "GB/s", HIGHER, "minimum traffic (inputs read once, outputs written "
           "once; a paged cache: the KV its contexts hold, kv_read_bytes, not the pool) / "
           "median time", section="Bandwidth (GB/s of the minimum traffic)",
           per_time=True),
    Metric("frac_matmul", "1", HIGHER, "tflops / the run's measured matmul rate for the "
           "dtype", section="Fraction of the measured matmul rate", percent=True,
           per_time=True),
    Metric("frac_bandwidth", "1", HIGHER, "gbps / the run's measured copy bandwidth for "
           "as much traffic (a working set that fits a cache is held to that cache's roof)",
           section="Fraction of the measured copy bandwidth", percent=True,
           per_time=True),
    Metric("peak_mem_bytes", "bytes", LOWER, "peak memory above what the inputs hold (GPU: "
           "max_memory_allocated; CPU: VmHWM after clear_refs)",
           section="Peak memory above inputs", sig=4, display_scale=2.0 ** -20,
           display_unit="MiB"),
    Metric("setup_s", "s", LOWER, "prepare(): parameters, layouts, compilation, outside "
           "timing"),
    Metric("compile_s", "s", LOWER, "first call of a compiled backend (compilation)"),
    Metric("probe_gflops", "GFLOP/s", HIGHER, "drift probe's rate (a fixed small matmul) "
           "measured between the record's rounds, median"),
    Metric("probe_spread", "1", LOWER, "(max - min) / median of the probe's rate during the "
           "record; above the run's threshold the record is flagged noisy", percent=True),
    Metric("work_flops", "FLOP", NEUTRAL, "FLOPs the backend performs for the case (its own "
           "count: visible pairs for exact backends, computed tiles, feature maps, ...)"),
    Metric("flops", "FLOP", NEUTRAL, "FLOPs of the case's visible query-key pairs "
           "(4 B Hq pairs D forward; bwd 2.5x, fwd_bwd 3.5x)"),
    Metric("flops_dense", "FLOP", NEUTRAL, "FLOPs of all Nq x Nk pairs"),
    Metric("input_bytes", "bytes", NEUTRAL, "bytes the inputs (q, k, v, grad_out) hold"),
    *_errors(),
    # Properties of the case's inputs (core/inputs_properties.py): why an approximation is
    # wrong on one input and not another. Measured once per inputs, on the full softmax.
    Metric("in_entropy", "1", NEUTRAL, "inputs: mean entropy of an attention row over "
           "log(Nk) (1 = uniform, as on randn; low = peaked)", sig=3),
    Metric("in_top8_mass", "1", NEUTRAL, "inputs: mean attention mass of a row's 8 largest "
           "weights", sig=3),
    Metric("in_sink_mass", "1", NEUTRAL, "inputs: attention mass, averaged over queries, on "
           "the key that receives most (an attention sink), mean over heads", sig=3),
    Metric("in_eff_rank_k", "1", NEUTRAL, "inputs: effective rank of each head's K (exp of "
           "the entropy of its normalised singular values; D for noise, r for rank r)", sig=3),
    Metric("in_kurtosis_qk", "1", NEUTRAL, "inputs: kurtosis of the entries of q and of k, "
           "the larger (3 for a normal; outlier channels raise it)", sig=3),
)

BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}
NAMES: tuple[str, ...] = tuple(BY_NAME)


def get(name: str) -> Metric:
    """The declaration of a metric; KeyError names what is declared."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name!r} is not a declared metric; declared: "
                       f"{', '.join(NAMES)}") from None


def tabulated() -> list[Metric]:
    """Metrics with a report section, in declaration order."""
    return [m for m in METRICS if m.section]


def markdown_table() -> str:
    """The metric columns' table (docs/records.md), generated from the declarations."""
    rows = ["| metric | unit | better | how |", "|---|---|---|---|"]
    for m in METRICS:
        rows.append(f"| `{m.name}` | {m.unit} | {m.better} | {m.how} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
