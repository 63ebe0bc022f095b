"""The record: what one (case, backend) measurement produced, as a declared type.

Identity (the frozen Case and the backend name) is kept apart from what was measured
(status, metrics, information such as the samples or the kernel that ran), like
torch.utils.benchmark keeps a task's identity apart from its Measurement. The worker returns
a Record; the runner adds run-level context; files hold it as one flat JSON object per line
(``to_row``), and ``from_row`` reads one back. Every record, crashed and timed-out ones
included, is built by ``Record.new``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attnbench.core import metrics
from attnbench.core.case import Case

# Version of the record and meta.json layout. 2: declared metrics, time intervals, work
# counted per backend, backend code hashes, the drift probe, paired rounds.
FORMAT_VERSION = 2

STATUSES = ("ok", "unavailable", "unsupported", "oom", "skipped", "error", "crashed",
            "timeout", "wrong")
CASE_COLUMNS = Case.columns()  # a record's case, column by column (``Case.to_dict``)
# Identity and run columns at the front of every row, before the declared metrics.
IDENTITY_COLUMNS = ("run_id", "key", "backend", "status", "reason", "noisy", *CASE_COLUMNS)
# Optional information columns (not metrics), with what they hold. Absent when not produced.
OPTIONAL_COLUMNS = {
    "noisy_by": "why a record is noisy: 'probe' (the drift probe moved more than "
                "noise_threshold), 'samples' (its own interval reaches farther than "
                "unsteady_rel from the median), or both",
    "profile_trace": "Chrome/Perfetto trace (.json.gz) of one untimed profiled call, relative "
                     "to the run directory (run --profile, attnbench profile)",
    "profile_kernels": "kernel table (CSV: name, calls, total and self ms, share of the "
                       "median, FLOP/s and GB/s where derivable), relative to the run directory",
    "profile_memory": "GPU memory timeline (.json.gz) of the profiled call",
    "profile_device": "cpu: the table lists ATen operators; cuda: GPU kernels",
    "profile_calls": "calls profiled (one, or a few when a call is short); the table is per call",
    "profile_total_ms": "sum of the kernel table's self times per call (compare with "
                        "time_ms_median)",
    "profile_wall_ms": "wall time of a profiled call (profiler overhead included)",
    "profile_plain_ms": "median wall time of plain calls alternating with the profiled ones "
                        "(the profiler's cost is the table's total over it)",
    "profile_top": "the kernel table's largest rows (name, calls, self_ms, share, tflops, gbps)",
    "inputs_source": "captured inputs: the model, layer, text (an installed package's, read at "
                     "run time) and windows their Q, K, V come from",
    "inputs_token_hash": "captured inputs: sha256 of the text's token ids (the capture cache's "
                         "key)",
    "lengths_count": "packed batch (lengths): number of documents over all rows",
    "lengths_max": "packed batch: the longest document's tokens",
    "lengths_mean": "packed batch: mean tokens per document",
    "lengths_padding_frac": "packed batch: 1 - total / (count * max), the share of a batch "
                            "padded to its longest document that is padding",
    "lengths_hash": "packed batch: sha256 of the documents' lengths, row by row",
    "lengths_source": "lengths text(package): the documents read (an installed package's "
                      "module docstrings, tokenized) and the sha256 of their lengths list",
    "context_max": "paged cache: the longest sequence's context length (tokens in its cache)",
    "context_mean": "paged cache: mean context length over the batch's sequences",
    "context_padding_frac": "paged cache: 1 - total / (batch * max), the share of a cache "
                            "padded to its longest context that is padding",
    "pages_used": "paged cache: pool pages the batch's contexts occupy",
    "pages_pool": "paged cache: pages in the pool (more than used when fragmented)",
    "kv_read_bytes": "paged cache: KV bytes a decode step reads (sum of context lengths x "
                     "Hkv x (D + Dv) x dtype bytes), the KV part of gbps's traffic",
    "page_table_hash": "paged cache: sha256 of the block table, row by row",
    "layout_density": "block_sparse: share of the case's pairs its block layout holds; 1.0 "
                      "means every tile, dense attention (its semantics then exact)",
    "triton_config": "triton_flash: launch configuration per kernel (block_m, block_n, "
                     "num_warps, num_stages) that ran",
    "triton_compiled": "triton_flash: compiled kernel metadata per kernel (registers, spill "
                       "bytes, shared memory bytes) and the configuration compiled",
    "triton_compiled_source": "where triton_compiled comes from: the binary that ran on the "
                              "GPU, or a compile for sm_90 without a GPU (interpreter runs)",
    "timed_under": "what the timed calls ran under instead of the device: 'triton "
                   "interpreter' (TRITON_INTERPRET=1); such a time is not a speed and is "
                   "kept out of every speed conclusion (its error still counts)",
    "timed_alone": "the group it was to be timed with in interleaved rounds crashed or timed "
                   "out (why); it was measured again on its own, so it has no pair_group",
}
OPTIONAL_COLUMNS |= {  # a packed batch's worst document (core/accuracy.py), per tensor
    f"err_doc_{t}_{what}": f"packed batch: {desc} of the document with the largest {t} error "
                           f"(err_doc_{t}_rel)"
    for t in ("out", "dq", "dk", "dv")
    for what, desc in (("row", "the row"), ("doc", "the index within its row"))}
# The device's state while the record's group was measured (measure/device_state.py) and how
# a GPU sample was taken (measure/timing_methods.py). Absent where not readable; records
# written before them load without them.
DEVICE_COLUMNS = {
    "timing_method": "how the samples were taken: on a GPU events (CUDA events, L2 flushed), "
                     "cudagraph (N calls over input copies in one graph, the replay over N) "
                     "or profiler (kernel device time); on a CPU wallclock (perf_counter)",
    "timing_method_note": "why a record's timing_method is not the suite's (a cudagraph "
                          "capture that failed: timed by events instead)",
    "graph_calls": "cudagraph: calls captured in the graph a sample replays",
    "graph_copies": "cudagraph: input copies the calls rotate over (their total above 2x L2)",
    "gpu_sm_mhz": "GPU SM clock over the group's readings, median (NVML)",
    "gpu_sm_mhz_min": "GPU SM clock, lowest reading of the group",
    "gpu_sm_mhz_max": "GPU SM clock, highest reading of the group",
    "gpu_mem_mhz": "GPU memory clock, median of the group's readings",
    "gpu_temp_c": "GPU temperature, highest reading of the group (C)",
    "gpu_power_limit_w": "GPU power limit in force (W)",
    "gpu_throttle_reasons": "NVML clock event reasons seen during the group, by name",
    "device_readings": "device state readings in the group (start, end, and during long ones)",
    "throttled": "why the group counts as measured throttled: an SM clock fall beyond "
                 "CLOCK_DROP_REL, throttle reasons ([] = not throttled; absent = not known)",
    "cpu_mhz_begin": "CPU: mean core frequency at the group's start (cpufreq or /proc/cpuinfo)",
    "cpu_mhz_end": "CPU: mean core frequency at the group's end",
    "power_w": "mean power over the group's rounds: energy counter difference / wall time",
    "energy_j": "energy per call: the group's mean power x the record's median time",
    "energy_source": "the energy counter read: nvml (GPU board) or rapl (CPU packages)",
    "tflops_per_j": "TFLOP of the backend's work per joule (work_flops / energy_j)",
    "sampler_error": "a device-state sampler that failed in this group (its fields are absent)",
}
OPTIONAL_COLUMNS |= DEVICE_COLUMNS
# Records of model runs (attnbench model): the case is a core.model_case.ModelCase, whose
# batch, dtype, device and mode share the kernel columns; the timing columns are the same.
MODEL_COLUMNS = {
    "model": "model runs: the model (model_zoo name)",
    "size": "model runs: the config's scale (tiny, cpu, h200), or real for pretrained weights "
            "(named size: scale is the kernel case's softmax scale)",
    "seq_len": "model runs: tokens per sequence",
    "level": "model runs: model (the whole step) or kernel (the attention case the model "
             "called, timed alone); mode is the step, fwd or train",
    "weights": "model runs: real (pretrained) or random",
    "attn_case": "model runs: key of the attention case the model called",
    "attn_share": "model runs: median share of the step spent in attention calls",
    "attn_share_lo": "model runs: lower end of the share's 95% interval",
    "attn_share_hi": "model runs: upper end of the share's 95% interval",
    "attn_share_samples": "model runs: the share of each timed pass",
    "attn_share_note": "model runs: why a backend has no share (eager's attention is "
                       "transformers' own code)",
    "rel_l2_vs_eager": "model runs, fwd: relative L2 of the last hidden state against eager",
    "cos_sim_vs_eager": "model runs, fwd, pooled models: mean cosine similarity of the "
                        "sentence embeddings against eager",
    "cos_sim_min": "model runs, fwd, pooled models: lowest cosine similarity of a sequence",
    "format": "models-1 on a record read from the first model-run layout (converted)",
}
OPTIONAL_COLUMNS |= MODEL_COLUMNS


@dataclass
class Record:
    case: Case
    backend: str
    status: str
    reason: str = ""
    metrics: dict[str, float] = field(default_factory=dict)  # declared metrics only
    info: dict[str, Any] = field(default_factory=dict)  # everything else (samples, kernel...)

    @classmethod
    def new(cls, case: Case, backend: str, status: str, reason: str = "", **values) -> Record:
        """The one constructor: values split into declared metrics and information."""
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}; allowed: {', '.join(STATUSES)}")
        rec = cls(case, backend, status, reason)
        rec.update(**values)
        return rec

    def update(self, **values) -> Record:
        for name, value in values.items():
            if name == "status":
                self.status = value
            elif name == "reason":
                self.reason = value
            elif name in metrics.BY_NAME:
                self.metrics[name] = value
            else:
                self.info[name] = value
        return self

    @property
    def key(self) -> str:
        return self.case.key

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_row(self) -> dict:
        """The flat JSON object a records.jsonl line holds."""
        return {"key": self.case.key, "backend": self.backend, **self.case.to_dict(),
                "status": self.status, "reason": self.reason, **self.metrics, **self.info}

    @classmethod
    def from_row(cls, row: dict) -> Record:
        case_fields = {k: row[k] for k in CASE_COLUMNS if k in row and row[k] is not None}
        rest = {k: v for k, v in row.items()
                if k not in CASE_COLUMNS and k not in ("key", "backend", "status", "reason")}
        return cls.new(Case(**case_fields), row["backend"], row["status"],
                       row.get("reason") or "", **rest)


def is_throttled(value) -> bool:
    """Whether a record's ``throttled`` field marks it (a list in records.jsonl, its text in
    results.csv; absent or NaN: not known, so not marked)."""
    if isinstance(value, (list, tuple)):
        return len(value) > 0
    return isinstance(value, str) and value.strip() not in ("", "[]")


INTERPRETED_KERNEL = "(interpreter)"  # how a Triton kernel label ends under the interpreter


def timed_under(row) -> str:
    """What a record (a mapping or a table row) was timed under when not the device itself,
    e.g. 'triton interpreter'; '' for a real speed (absent, NaN, empty). A record written
    before the column existed says it only by its kernel label."""
    get = row.get if hasattr(row, "get") else (lambda _: None)
    value = get("timed_under")
    if isinstance(value, str) and value:
        return value
    kernel = get("kernel")
    if isinstance(kernel, str) and kernel.endswith(INTERPRETED_KERNEL):
        return "triton interpreter"
    return ""


def speed_records(df):
    """The rows of a records table whose times are speeds: those not timed under an
    interpreter or emulator (``timed_under``)."""
    columns = [c for c in ("timed_under", "kernel") if c in df.columns]
    if not columns:
        return df
    return df[[not timed_under(dict(zip(columns, values)))
               for values in zip(*(df[c] for c in columns))]]
