"""The ``[models]`` section of a suite file: which models a model-level run builds, at which
(batch, N), with which backends. Data only; errors are one line naming file, key, value and
what is allowed.

```toml
[models]
dtype = "float32"                       # float32 | float16 | bfloat16
backends = ["eager", "sdpa", "naive"]   # eager = transformers' own attention
steps = ["fwd", "train"]
share_passes = 6                        # passes timing attention's share of the step
timing = { warmup_s = 0.1, budget_s = 1.0, min_reps = 6, max_reps = 20 }
[[models.run]]
model = "llama3"                        # minilm (real weights), llama3, mistral, gpt2, bert
scale = "cpu"                           # tiny | cpu | h200 (minilm: its own size)
batch = 1
seq_len = [512]
backends = ["eager", "sdpa"]            # optional: replaces the section's list
```
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnbench.core.dtypes import canonical_dtype
from attnbench.core.errors import BadInput
from attnbench.measure.budget import TimingBudget
from attnbench.measure.model_step import EAGER, STEPS, ModelJob
from attnbench.measure.model_zoo import MODELS, SCALES
from attnbench.runs.suite import find_suite, tomllib

SECTION = "models"
SECTION_KEYS = ("description", "dtype", "backends", "steps", "share_passes", "timing", "run")
RUN_KEYS = ("model", "scale", "batch", "seq_len", "backends", "steps")
DTYPES = ("float32", "float16", "bfloat16")
TIMING = {"warmup_s": float, "budget_s": float, "min_reps": int, "max_reps": int,
          "target_rel": float}  # the TimingBudget fields a model run uses


@dataclass
class ModelSuite:
    name: str
    path: Path
    description: str
    jobs: list[ModelJob]
    budget: TimingBudget
    text: str = ""  # the TOML as read: what --resume replays, whatever the file holds later


class _Check:
    def __init__(self, path: Path):
        self.path = path

    def fail(self, key: str, value, allowed: str):
        raise BadInput(f"{self.path}: {SECTION}.{key} = {value!r}: {allowed}")

    def keys(self, table: dict, allowed, where: str):
        for key in table:
            if key not in allowed:
                self.fail(f"{where}{key}", table[key], f"unknown key; allowed: "
                                                       f"{', '.join(allowed)}")

    def names(self, value, where: str, allowed) -> tuple[str, ...]:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items or not all(isinstance(x, str)
                                                               for x in items):
            self.fail(where, value, "must be a non-empty list of names")
        for x in items:
            if allowed is not None and x not in allowed:
                self.fail(where, value, f"unknown name {x!r}; allowed: {', '.join(allowed)}")
        return tuple(items)

    def positive(self, value, where: str) -> list[int]:
        items = value if isinstance(value, list) else [value]
        if not items or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                                for x in items):
            self.fail(where, value, "must be a positive integer or a list of them")
        return items


def _dtype(name: str) -> str | None:
    try:
        return canonical_dtype(name)
    except (ValueError, KeyError):
        return None


def load_model_suite(name_or_path: str, known_backends: list[str], device: str) -> ModelSuite:
    path = find_suite(name_or_path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{path}: not valid TOML: {str(exc).splitlines()[0]}") from None
    return parse_model_suite(text, path, known_backends, device)


def parse_model_suite(text: str, path: Path, known_backends: list[str],
                      device: str) -> ModelSuite:
    """A suite's ``[models]`` section from its TOML (``path`` names it in errors)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{path}: not valid TOML: {str(exc).splitlines()[0]}") from None
    section = data.get(SECTION)
    if not isinstance(section, dict):
        raise BadInput(f"{path}: no [{SECTION}] section; allowed: a suite with a [{SECTION}] "
                       f"table (e.g. suites/model_steps_cpu.toml)")
    c = _Check(path)
    c.keys(section, SECTION_KEYS, "")
    dtype = section.get("dtype", "float32")
    if not isinstance(dtype, str) or _dtype(dtype) not in DTYPES:
        c.fail("dtype", dtype, f"allowed: {', '.join(DTYPES)}")
    allowed_backends = [EAGER, *sorted(known_backends)]
    backends = c.names(section.get("backends", [EAGER, "sdpa"]), "backends", allowed_backends)
    steps = c.names(section.get("steps", list(STEPS)), "steps", STEPS)
    share_passes = c.positive(section.get("share_passes", 6), "share_passes")[0]
    timing = section.get("timing", {})
    if not isinstance(timing, dict):
        c.fail("timing", timing, "must be a table")
    c.keys(timing, tuple(TIMING), "timing.")
    for k, v in timing.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            c.fail(f"timing.{k}", v, "must be a non-negative number")
        if TIMING[k] is int and (not isinstance(v, int) or v < 1):
            c.fail(f"timing.{k}", v, "must be a positive integer")
    budget = TimingBudget(**{k: TIMING[k](v) for k, v in timing.items()})
    runs = section.get("run")
    if not isinstance(runs, list) or not runs:
        c.fail("run", runs, "must be a non-empty array of tables ([[models.run]])")
    jobs = []
    for i, run in enumerate(runs):
        where = f"run[{i}]."
        if not isinstance(run, dict):
            c.fail(f"run[{i}]", run, "must be a table")
        c.keys(run, RUN_KEYS, where)
        model = run.get("model")
        if model not in MODELS:
            c.fail(f"{where}model", model, f"allowed: {', '.join(MODELS)}")
        scale = run.get("scale", "cpu")
        if scale not in SCALES:
            c.fail(f"{where}scale", scale, f"allowed: {', '.join(SCALES)}")
        run_backends = c.names(run.get("backends", list(backends)), f"{where}backends",
                               allowed_backends)
        if EAGER not in run_backends:  # drift is measured against eager
            run_backends = (EAGER, *run_backends)
        run_steps = c.names(run.get("steps", list(steps)), f"{where}steps", STEPS)
        for batch in c.positive(run.get("batch", 1), f"{where}batch"):
            for n in c.positive(run.get("seq_len", 512), f"{where}seq_len"):
                jobs.append(ModelJob(model, scale, batch, n, canonical_dtype(dtype), device,
                                     run_backends, run_steps, share_passes))
    return ModelSuite(data.get("name", path.stem), path, section.get("description", ""),
                      jobs, budget, text)
