"""Suites: TOML data describing sweeps. Loaded, validated, expanded into (case, backend) jobs.

Validation errors are ``BadInput`` with one line naming the file, the key, the bad value
and what is allowed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from attnbench.analysis.claim_checks import validate_claims
from attnbench.analysis.comparisons import Comparison, validate_comparisons
from attnbench.core import inputs as inputs_kinds
from attnbench.core import knobs, paging
from attnbench.core import lengths as lengths_axis
from attnbench.core.case import MODES, Case
from attnbench.core.dtypes import DTYPES, canonical_dtype
from attnbench.core.errors import BadInput, shown
from attnbench.core.masks import INT64_MAX, MASK_KINDS, MaskSpec
from attnbench.measure.budget import TIMING_METHODS, TimingBudget
from attnbench.runs import arith

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TOP_KEYS = ("name", "description", "backends", "axes", "derive", "exclude", "timing", "defaults",
            "sweep", "claim", "comparison",
            "models")  # read by runs/model_suite.py (attnbench model), not by attnbench run
SWEEP_KEYS = ("name", "backends", "axes", "derive", "exclude", "devices", "params")
DEVICE_TYPES = ("cpu", "cuda")  # a sweep's ``devices``: the device types it runs on
TIMING_KEYS = {"warmup_s": float, "budget_s": float, "min_reps": int, "max_reps": int,
               "timeout_s": float, "target_rel": float, "noise_threshold": float,
               "unsteady_rel": float, "processes": int, "slow_dtype_factor": float,
               "rewarm_s": float, "method": str, "retakes": int,
               "setup_timeout_s": float}
# Upper bounds: beyond them a value is a typo, not a plan (a week, a million samples).
TIMING_MAX = {"warmup_s": 3600.0, "rewarm_s": 60.0, "budget_s": 86400.0, "timeout_s": 604800.0,
              "setup_timeout_s": 604800.0,
              "min_reps": 1_000_000, "max_reps": 1_000_000, "target_rel": 1.0,
              "noise_threshold": 100.0, "unsteady_rel": 100.0, "processes": 100,
              "retakes": 3}
# The problem's fields, then every built-in backend parameter (core/knobs.py) by name.
AXIS_KEYS = Case.columns() + ("seq_len",)
INT_AXES = ({f.name for f in dataclasses.fields(Case) if f.type in ("int", int)}
            | {n for n, p in knobs.BUILT_IN.items() if p.kind is int} | {"seq_len"})
# The problem's own bounds, a block layout's geometry's among them (a block-sparse mask's:
# from its declaration); a backend parameter's are in its declaration (check_params).
POSITIVE_AXES = {"batch", "heads_q", "heads_kv", "seq_q", "seq_k", "seq_len", "head_dim",
                 "head_dim_v"} | {n for n, p in knobs.BLOCK.items() if p.minimum == 1}
NON_NEGATIVE_AXES = {"seed", "page_size"} | {n for n, p in knobs.BLOCK.items()
                                             if p.minimum == 0}
SEQ_AXES = ("seq_len", "seq_q", "seq_k")
# Axes whose values a Case checks together (heads_q must be a multiple of heads_kv).
JOINT_AXES = ("heads_q", "heads_kv")
# The axes an inputs kind other than randn limits (captured heads and length, a rank).
INPUTS_SHAPE_AXES = ("inputs", "heads_q", "heads_kv", "seq_len", "seq_q", "seq_k", "head_dim",
                     "head_dim_v")
# The axes a packed batch (lengths) limits: self-attention, a none or causal mask.
LENGTHS_SHAPE_AXES = ("lengths", "seq_len", "seq_q", "seq_k", "mask")
# The axes a paged cache limits: a forward decode step, none or causal, seq_q <= seq_k.
PAGED_SHAPE_AXES = ("page_size", "pages", "seq_len", "seq_q", "seq_k", "mask", "mode")
# Load checks every combination of the axes that can make a case invalid (those above, those
# derived values read, those excludes name) when there are at most this many; beyond it the
# remaining combinations are checked as the sweep expands (still before anything runs).
LOAD_CHECK_POINTS = 10_000


@dataclass
class Sweep:
    name: str
    backends: list[str]
    axes: dict[str, list]
    exclude: list[dict[str, list]] = field(default_factory=list)
    # axes computed from the others at each point (``batch = "16384 // seq_len"``)
    derive: dict[str, arith.Expression] = field(default_factory=dict)
    devices: tuple[str, ...] = ()  # device types this sweep runs on; () = every device
    # backends the command line added to a sweep that does not list them: each runs only on
    # the cases it supports, so it adds no `unsupported` record nobody asked for
    supported_only: tuple[str, ...] = ()
    # [sweep.params.BACKEND]: parameter -> values given to that backend's cases only, so
    # they enter its records' keys and no other backend's
    params: dict[str, dict[str, list]] = field(default_factory=dict)

    def backend_cases(self, case: Case, backend: str) -> list[Case]:
        """``case`` with each combination of the parameters this sweep gives ``backend``."""
        own = self.params.get(backend)
        if not own:
            return [case]
        names = list(own)
        out = []
        for values in itertools.product(*(own[n] for n in names)):
            out.append(case.with_params(**dict(zip(names, values))))
        return out

    def combinations(self, backend: str) -> int:
        """How many cases ``backend_cases`` makes of one case for ``backend``."""
        return math.prod(len(set(map(str, v))) for v in self.params.get(backend, {}).values())

    def runs_on(self, device: str) -> bool:
        return not self.devices or device.split(":")[0] in self.devices

    def cases(self) -> list[Case]:
        return list(self.iter_cases())

    def iter_cases(self):
        """The cases in order, made one at a time (a caller may stop early). ValueError
        names the derived axis or the case field at fault."""
        names = [a for a in self.axes if a not in SEQ_AXES] + [a for a in SEQ_AXES
                                                                 if a in self.axes]
        for values in itertools.product(*(self.axes[n] for n in names)):
            point = dict(zip(names, values))
            for axis, expression in self.derive.items():
                point[axis] = _derived_value(axis, expression, point)
            if any(_matches(ex, point) for ex in self.exclude if "backend" not in ex):
                continue
            if "seq_len" in point:
                n = point.pop("seq_len")
                point.setdefault("seq_q", n)
                point.setdefault("seq_k", n)
            point.setdefault("heads_kv", point.get("heads_q", Case.heads_q))
            point.setdefault("head_dim_v", point.get("head_dim", Case.head_dim))
            case = Case(**point)
            if case.inputs_problem():
                raise ValueError(case.inputs_problem())
            yield case

    def checked_at_load(self) -> Sweep | None:
        """The part of this sweep whose cases load checks: every combination of the axes
        that can make a case or a derived value invalid, the other axes at their first
        value; None when those combinations are more than LOAD_CHECK_POINTS."""
        relevant = set(JOINT_AXES) | {k for rule in self.exclude if "backend" not in rule
                                      for k in rule}
        if any(v != "randn" for v in self.axes.get("inputs", ["randn"])):
            relevant |= set(INPUTS_SHAPE_AXES)  # what an inputs kind's shape limits read
        if any(self.axes.get("lengths", [""])):
            relevant |= set(LENGTHS_SHAPE_AXES)  # a packed batch's shape and mask limits
        if any(self.axes.get("page_size", [0])) or any(self.axes.get("pages", [""])):
            relevant |= set(PAGED_SHAPE_AXES)  # a paged decode step's limits
        for expression in self.derive.values():
            relevant |= expression.names
        if "seq_len" in relevant:
            relevant |= {"seq_q", "seq_k"}
        axes = {k: (v if k in relevant else v[:1]) for k, v in self.axes.items()}
        if math.prod(len(v) for v in axes.values()) > LOAD_CHECK_POINTS:
            return None
        return dataclasses.replace(self, axes=axes)

    def bounds_problem(self) -> tuple[str, object, str] | None:
        """(axis, value, problem) for a block longer than every sequence length the sweep
        gives, read from its axes (nothing expanded); None when none is, or the lengths or
        the block are derived (their values are known only point by point)."""
        if "block_size" not in self.axes or "block_size" in self.derive or any(
                a in self.derive for a in SEQ_AXES):
            return None
        lengths = [n for a in SEQ_AXES for n in self.axes.get(a, [])] or [Case.seq_q,
                                                                          Case.seq_k]
        longest = max(lengths)
        for block in self.axes["block_size"]:
            if block > longest:
                return ("block_size", block, f"longer than every sequence length (the longest "
                                             f"is {longest}); allowed: at most {longest}")
        return None

    def pair_bounds(self) -> tuple[int, int]:
        """(at least, at most) how many (case, backend) pairs this sweep gives on one device,
        from the lengths of its axes alone: nothing is expanded. An exclude rule removes at
        most the product of the values it matches (axes it does not name, or that are
        derived, count whole), so the lower bound subtracts each rule's maximum."""
        distinct = {k: len(set(v)) for k, v in self.axes.items() if k != "device"}
        backends = set(self.backends)
        weight = {b: self.combinations(b) for b in backends}
        high = math.prod(distinct.values()) * sum(weight.values())
        removed = 0
        for rule in self.exclude:
            if any(k not in self.axes and k not in self.derive and k not in AXIS_KEYS
                   and k != "backend" for k in rule):
                continue  # names nothing a point has: matches nothing
            if "backend" not in rule and any(k not in self.axes and k not in self.derive
                                             for k in rule):
                continue  # an axis rule matches only axes (and derived ones) of the point
            n = sum(weight[b] for b in (backends & set(rule["backend"]) if "backend" in rule
                                        else backends))
            for axis, count in distinct.items():
                n *= len(set(self.axes[axis]) & set(rule[axis])) if axis in rule else count
            removed += n
        return max(0, high - removed), high

    def excluded_backends(self, case: Case) -> set[str]:
        """The sweep's backends an exclude rule removes from ``case`` (its point made once
        per case, not per pair)."""
        rules = [ex for ex in self.exclude if "backend" in ex]
        if not rules:
            return set()
        point = case.to_dict() | {"seq_len": case.seq_q}
        return {b for b in self.backends
                if any(_matches(ex, point | {"backend": b}) for ex in rules)}


def _derived_value(axis: str, expression: arith.Expression, point: dict) -> int:
    """``expression`` at ``point``, checked like a value written in the suite."""
    env = dict(point)
    if "seq_len" not in env and env.get("seq_q") is not None:
        env.setdefault("seq_len", env["seq_q"])
    try:
        value = expression(env)
    except arith.ArithError as exc:
        raise ValueError(f"derive.{axis} = {expression.text!r}: {exc}") from None
    floor = 1 if axis in POSITIVE_AXES else 0 if axis in NON_NEGATIVE_AXES else None
    if floor is not None and value < floor:  # checked like a value written in the suite
        at = ", ".join(f"{n}={env[n]}" for n in sorted(expression.names))
        allowed = "a positive integer" if floor else "an integer >= 0"
        raise ValueError(f"derive.{axis} = {expression.text!r} gives {value} at {at}; "
                         f"{axis} must be {allowed}")
    return value


def _matches(rule: dict[str, list], point: dict) -> bool:
    return all(k in point and point[k] in values for k, values in rule.items())


@dataclass
class Suite:
    name: str
    description: str
    path: str
    content_hash: str
    timing: TimingBudget
    timeout_s: float
    sweeps: list[Sweep]
    claims: list[dict] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)  # the report's panel sets
    text: str = ""  # the TOML it was read from: a run records it and --resume replays it
    notes: list[str] = field(default_factory=list)  # what command-line overrides changed
    # (key, name) of every backend the file names, as ``check_backends`` checks them
    named_backends: list[tuple[str, str]] = field(default_factory=list)
    single: bool = False  # written without [[sweep]] tables: key paths have no sweep[i].

    def jobs(self, limit: int | None = None) -> list[tuple[Case, str]]:
        """(case, backend) pairs in run order: every backend of a case together, sizes rising.
        With ``limit``, expansion stops once there are more than ``limit`` pairs."""
        seen = set()
        jobs = []
        for sweep in self.sweeps:
            try:
                for case in sweep.iter_cases():
                    excluded = sweep.excluded_backends(case)
                    for backend in sweep.backends:
                        if backend in excluded:
                            continue
                        for own in sweep.backend_cases(case, backend):
                            if (own.key, backend) in seen or (
                                    backend in sweep.supported_only
                                    and not _supports(backend, own)):
                                continue
                            seen.add((own.key, backend))
                            jobs.append((own, backend))
                    if limit is not None and len(jobs) > limit:
                        return jobs
            except ValueError as exc:  # a combination load could not check in full
                raise BadInput(f"{self.path}: sweep {sweep.name!r}: {exc}") from None
        return jobs

    def pair_bounds(self, device: str) -> tuple[int, int]:
        """(at least, at most) the pairs ``jobs_on(device)`` gives, from the axes alone."""
        bounds = [s.pair_bounds() for s in self.sweeps if s.runs_on(device)]
        return max((lo for lo, _ in bounds), default=0), sum(hi for _, hi in bounds)

    def jobs_on(self, device: str, limit: int | None = None) -> list[tuple[Case, str]]:
        """The jobs with every case on ``device`` (what a run on it will execute): the sweeps
        whose ``devices`` include its type, e.g. a bf16 sweep for GPUs beside a smaller fp32
        one for CPUs."""
        kept = [s for s in self.sweeps if s.runs_on(device)]
        if not kept:
            raise BadInput(f"{self.path}: no sweep runs on {device}; its sweeps' devices: "
                           f"{', '.join(sorted({d for s in self.sweeps for d in s.devices}))}")
        kept = [dataclasses.replace(s, axes=s.axes | {"device": [device]}) for s in kept]
        return Suite(self.name, self.description, self.path, self.content_hash, self.timing,
                     self.timeout_s, kept).jobs(limit)

    @property
    def backends(self) -> list[str]:
        return list(dict.fromkeys(b for s in self.sweeps for b in s.backends))

    def check_backends(self, known_backends: list[str]) -> None:
        """The one-line error ``load_suite`` gives with ``known_backends`` for the first
        unknown name, for a suite loaded without them (the registry imports every
        implementation: a suite loads, and a plan too large is refused, without it)."""
        v = _Validator(Path(self.path), known_backends)
        for where, name in self.named_backends:
            v.backends(name, where)
        check_params(self)

    def sweep_where(self, sweep: Sweep) -> str:
        """The key path of ``sweep`` as the file names it."""
        i = self.sweeps.index(sweep)
        return "" if self.single else f"sweep[{i}]."


def find_suite(name_or_path: str) -> Path:
    """A path to a TOML file, or the name of a suite in ./suites or shipped with attnbench."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        if not p.is_file():
            raise BadInput(f"{name_or_path}: suite file not found")
        return p
    local = Path("suites") / f"{name_or_path}.toml"
    if local.is_file():
        return local
    shipped = resources.files("attnbench.suites") / f"{name_or_path}.toml"
    if shipped.is_file():
        return Path(str(shipped))
    known = sorted({q.stem for q in Path("suites").glob("*.toml")} | {
        Path(str(q)).stem for q in resources.files("attnbench.suites").iterdir()
        if str(q).endswith(".toml")})
    raise BadInput(f"unknown suite {name_or_path!r}; known suites: {', '.join(known)} "
                   f"(or give a path to a .toml file)")


def _depth(x) -> int:
    """How deeply the first elements of nested lists go: [[1, 2]] -> 2."""
    return 1 + _depth(x[0]) if isinstance(x, list) and x else int(isinstance(x, list))


class _Validator:
    def __init__(self, path: Path, known_backends: list[str] | None):
        self.path = path
        self.known_backends = known_backends
        self.named_backends: list[tuple[str, str]] = []  # (key, name) as met

    def fail(self, key: str, value, problem: str):
        raise BadInput(f"{self.path}: {key} = {shown(value)}: {problem}")

    def unknown_keys(self, table: dict, allowed, where: str):
        for key in table:
            if key not in allowed:
                self.fail(f"{where}{key}", table[key],
                          f"unknown key; allowed: {', '.join(allowed)}")

    def axis_values(self, key: str, raw, where: str = "") -> list:
        # block_pairs is itself a list of [qb, kb] pairs: it is swept only as a list of them
        nested = 2 if key == "block_pairs" else 0
        is_sweep = isinstance(raw, list) and (nested == 0 or _depth(raw) > nested)
        values = raw if is_sweep else [raw]
        if not values:
            self.fail(where + key, raw, "empty list; give at least one value")
        return [self.axis_value(key, v, where) for v in values]

    def axis_value(self, key: str, v, where: str = ""):
        try:
            return self._axis_value(key, v)
        except BadInput as exc:
            if where:
                raise BadInput(str(exc).replace(f": {key} = ", f": {where}{key} = ", 1)) from None
            raise

    def _axis_value(self, key: str, v):
        if key in INT_AXES:
            if isinstance(v, bool) or not isinstance(v, int):
                self.fail(key, v, "must be an integer")
            if key in POSITIVE_AXES and v <= 0:
                self.fail(key, v, "must be a positive integer")
            if key in NON_NEGATIVE_AXES and v < 0:
                self.fail(key, v, "must be >= 0")
            if abs(v) > INT64_MAX:
                self.fail(key, v, f"beyond int64; allowed: at most {INT64_MAX}")
            return v
        if key == "dtype":
            try:
                return canonical_dtype(str(v))
            except ValueError:
                self.fail(key, v, f"unknown dtype; allowed: {', '.join(DTYPES)}")
        if key == "mask":
            try:
                return str(MaskSpec.parse(str(v)))
            except ValueError as exc:
                self.fail(key, v, str(exc) if "allowed" in str(exc) else
                          f"{exc}; allowed forms: {', '.join(MASK_KINDS)}")
        if key == "inputs":
            try:
                return str(inputs_kinds.parse(str(v)))
            except ValueError as exc:
                self.fail(key, v, str(exc))
        if key == "lengths":
            if not isinstance(v, str):
                self.fail(key, v, f"must be a string; allowed: {lengths_axis.FORMS} or \"\" "
                                  f"(a dense batch)")
            try:
                return str(lengths_axis.parse(v)) if v else v
            except ValueError as exc:
                self.fail(key, v, str(exc))
        if key == "pages":
            if not isinstance(v, str) or (v and v not in paging.LAYOUTS):
                self.fail(key, v, f"unknown page layout; allowed: {', '.join(paging.LAYOUTS)} "
                                  f"or \"\" (no paging)")
            return v
        if key == "mode":
            if v not in MODES:
                self.fail(key, v, f"unknown mode; allowed: {', '.join(MODES)}")
            return v
        if key == "device":
            if not isinstance(v, str) or v.split(":")[0] not in ("cpu", "cuda", "auto"):
                self.fail(key, v, "unknown device; allowed: auto, cpu, cuda, cuda:N")
            return v
        if key == "scale":
            # Any finite nonzero scale, as PyTorch's own SDPA tests use: negative scales
            # exercise kernels' masking and max-shift paths (and find upstream faults).
            if (not isinstance(v, (int, float)) or isinstance(v, bool) or v == 0
                    or not math.isfinite(v)):
                self.fail(key, v, "must be a finite nonzero number")
            return float(v)
        if key == "block_pairs":
            if not isinstance(v, list) or not all(
                    isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) for x in p)
                    for p in v):
                self.fail(key, v, "must be a list of [query_block, key_block] integer pairs")
            if any(abs(x) > INT64_MAX for p in v for x in p):
                self.fail(key, v, f"a block index beyond int64; allowed: at most {INT64_MAX}")
            return tuple(tuple(p) for p in v)
        if not isinstance(v, str):
            self.fail(key, v, "must be a string")
        return v

    def derive(self, table: dict, where_of, axes: dict[str, list]
               ) -> dict[str, arith.Expression]:
        """Parsed expressions in the order given; each may use the axes and the axes derived
        before it. ``where_of(axis)`` is the key path to name in errors."""
        self.unknown_keys(table, sorted(INT_AXES - {"seq_len"}), where_of(""))
        out = {}
        for axis, text in table.items():
            if axis in axes:
                self.fail(where_of(axis), text, f"{axis} is also given in axes; give it once")
            try:
                out[axis] = arith.parse(text, set(axes) | {"seq_len"} | set(out))
            except arith.ArithError as exc:
                self.fail(where_of(axis), text, str(exc))
        return out

    def axes(self, table, where: str) -> dict[str, list]:
        if not isinstance(table, dict):
            self.fail(where.rstrip("."), table, "must be a table of axis = value or [values]")
        self.unknown_keys(table, AXIS_KEYS, where)
        return {k: self.axis_values(k, v, where) for k, v in table.items()}

    def backends(self, raw, where: str) -> list[str]:
        if isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list) or not raw or not all(isinstance(b, str) for b in raw):
            self.fail(where, raw, "must be a non-empty list of backend names")
        self.named_backends += [(where, b) for b in raw]
        if self.known_backends is not None:
            for b in raw:
                if b not in self.known_backends:
                    self.fail(where, b, f"unknown backend; allowed: "
                                        f"{', '.join(sorted(self.known_backends))}")
        return list(raw)

    def backend_params(self, raw, backends: list[str], where: str) -> dict[str, dict[str, list]]:
        """[sweep.params.BACKEND] tables: the values' forms here; whether the backend declares
        each parameter, and allows its values, is ``check_params``'s."""
        if not isinstance(raw, dict):
            self.fail(where.rstrip("."), raw, "must be a table of [params.BACKEND] tables")
        out: dict[str, dict[str, list]] = {}
        for backend, table in raw.items():
            if backend not in backends:
                self.fail(f"{where}{backend}", table, f"not a backend of this sweep; allowed: "
                                                      f"{', '.join(backends)}")
            if not isinstance(table, dict) or not table:
                self.fail(f"{where}{backend}", table,
                          "must be a non-empty table of parameter = value or [values]")
            out[backend] = {n: self.param_values(n, v, f"{where}{backend}.")
                            for n, v in table.items()}
        return out

    def param_values(self, name: str, raw, where: str) -> list:
        if name in Case.CORE_FIELDS or name in ("seq_len", "params", "device"):
            self.fail(where + name, raw, "a problem axis, not a backend parameter; give it "
                                         "in axes")
        if name in AXIS_KEYS:
            return self.axis_values(name, raw, where)
        if not name.isidentifier():
            self.fail(where + name, raw, "not a parameter name; allowed: a Python identifier")
        values = raw if isinstance(raw, list) else [raw]
        if not values:
            self.fail(where + name, raw, "empty list; give at least one value")
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float, str)) or (
                    isinstance(v, str) and (not v or "," in v or "=" in v)) or (
                    isinstance(v, float) and not math.isfinite(v)):
                self.fail(where + name, v, "allowed: an integer, a finite number or a "
                                           "non-empty string without ',' or '='")
        return values

    def excludes(self, raw, where: str) -> list[dict[str, list]]:
        if raw is None:
            return []
        if isinstance(raw, dict):
            raw = [raw]
        if not isinstance(raw, list) or not all(isinstance(r, dict) for r in raw):
            self.fail(where, raw, "must be a list of tables of axis = value(s)")
        rules = []
        for rule in raw:
            self.unknown_keys(rule, AXIS_KEYS + ("backend",), f"{where}.")
            rules.append({k: (self.backends(v, f"{where}.backend") if k == "backend"
                              else self.axis_values(k, v, f"{where}.")) for k, v in rule.items()})
        return rules


def _table(v: _Validator, raw, where: str) -> dict:
    if not isinstance(raw, dict):
        v.fail(where, raw, 'must be a table of axis = "expression"')
    return raw


def load_suite(name_or_path: str, known_backends: list[str] | None = None,
               text: str | None = None) -> Suite:
    """The suite named or at a path; with ``text`` (what a run recorded), that TOML under the
    recorded name, whatever the file holds now. Its backend names are checked against
    ``known_backends`` when given, else later by ``Suite.check_backends``."""
    path = Path(name_or_path) if text is not None else find_suite(name_or_path)
    raw_bytes = path.read_bytes() if text is None else text.encode("utf-8")
    try:
        data = tomllib.loads(raw_bytes.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: not valid TOML: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise BadInput(f"{path}: not valid TOML: nested too deeply") from None
    suite = parse_suite(data, path, known_backends, hashlib.sha256(raw_bytes).hexdigest()[:16])
    suite.text = raw_bytes.decode("utf-8")
    return suite


def parse_suite(data: dict, path: Path, known_backends: list[str] | None = None,
                content_hash: str = "") -> Suite:
    v = _Validator(path, known_backends)
    v.unknown_keys(data, TOP_KEYS, "")
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not name:
        v.fail("name", name, "must be a non-empty string")
    timing_raw = data.get("timing", {})
    if not isinstance(timing_raw, dict):
        v.fail("timing", timing_raw, "must be a table")
    v.unknown_keys(timing_raw, tuple(TIMING_KEYS), "timing.")
    timing = {}
    for key, value in timing_raw.items():
        kind = TIMING_KEYS[key]
        if key == "method":  # how a GPU sample is taken (measure/timing_methods.py)
            if value not in TIMING_METHODS:
                v.fail("timing.method", value, f"must be one of {', '.join(TIMING_METHODS)}")
            timing[key] = value
            continue
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        zero_ok = key in ("warmup_s", "rewarm_s", "retakes")
        floor_ok = number and (value >= 0 if zero_ok else value > 0)
        if not floor_ok or not math.isfinite(value) or value > TIMING_MAX.get(key, 1e6) or (
                kind is int and not isinstance(value, int)):
            sign = "non-negative" if zero_ok else "positive"
            v.fail(f"timing.{key}", value, f"must be a {sign} {kind.__name__} "
                                           f"(at most {TIMING_MAX.get(key, 1e6):g})")
        timing[key] = value
    timeout_s = float(timing.pop("timeout_s", 600.0))
    defaults = v.axes(data.get("defaults", {}), "defaults.")
    sweeps_raw = data.get("sweep")
    if sweeps_raw is None:
        if "backends" not in data or "axes" not in data:
            v.fail("backends/axes", None, "a suite needs top-level backends and [axes], "
                                          "or [[sweep]] tables")
        sweeps_raw = [{"backends": data["backends"], "axes": data["axes"],
                       "exclude": data.get("exclude")}]
    elif "axes" in data:
        v.fail("axes", data["axes"], "give axes inside each [[sweep]] (or use [defaults])")
    if not isinstance(sweeps_raw, list) or not sweeps_raw:
        v.fail("sweep", sweeps_raw, "must be a list of [[sweep]] tables")
    sweeps = []
    single = "sweep" not in data
    for i, s in enumerate(sweeps_raw):
        where = "" if single else f"sweep[{i}]."  # key paths as the user wrote them
        if not isinstance(s, dict):
            v.fail(where.rstrip("."), s, "must be a table")
        v.unknown_keys(s, SWEEP_KEYS, where)
        backends = v.backends(s.get("backends", data.get("backends")), f"{where}backends")
        axes = dict(defaults) | v.axes(s.get("axes", {}), f"{where}axes.")
        if not axes:
            v.fail(f"{where}axes", {}, "empty; give at least seq_len (a default case is "
                                       "never run silently)")
        if "seq_len" in axes and ({"seq_q", "seq_k"} & set(axes)):
            v.fail(f"{where}axes.seq_len", axes["seq_len"], "give seq_len or seq_q/seq_k, "
                                                            "not both")
        excludes = v.excludes(s.get("exclude"), f"{where}exclude")
        # top-level derive applies to every [[sweep]] that does not give the axis itself; in
        # a suite without sweeps its axes are the top-level ones: an axis given both ways
        # is refused below, never silently dropped
        top = {a: e for a, e in _table(v, data.get("derive", {}), "derive").items()
               if single or a not in s.get("axes", {})}
        own = _table(v, s.get("derive", {}), f"{where}derive")
        derive = v.derive(top | own, lambda a, own=own, where=where: (
            f"{where}derive.{a}" if a in own or not a else f"derive.{a}"), axes)
        devices = s.get("devices", [])
        devices = [devices] if isinstance(devices, str) else devices
        if not isinstance(devices, list) or not devices and "devices" in s or any(
                d not in DEVICE_TYPES for d in devices):
            v.fail(f"{where}devices", s["devices"], f"must be a non-empty list of device "
                                                    f"types; allowed: {', '.join(DEVICE_TYPES)}")
        sweep_name = s.get("name", f"sweep{i}")
        if not isinstance(sweep_name, str) or not sweep_name:
            v.fail(f"{where}name", sweep_name, "must be a non-empty string")
        own_params = v.backend_params(s.get("params", {}), backends, f"{where}params.")
        sweep = Sweep(sweep_name, backends, axes, excludes, derive, tuple(devices),
                      params=own_params)
        bad = sweep.bounds_problem()
        if bad:
            v.fail(f"{where}axes.{bad[0]}", bad[1], bad[2])
        try:
            checked = sweep.checked_at_load()
            for _ in (checked.iter_cases() if checked else ()):
                pass
        except ValueError as exc:
            if str(exc).startswith("derive."):
                raise BadInput(f"{path}: {where}{exc}") from None
            v.fail(f"{where}axes", {k: axes[k] for k in axes if k in str(exc)} or axes,
                   str(exc))
        sweeps.append(sweep)
    suite = Suite(name, str(data.get("description", "")), str(path), content_hash,
                  TimingBudget(**timing), timeout_s, sweeps,
                  validate_claims(data.get("claim"), path),
                  validate_comparisons(data.get("comparison"), path, v.axes, v.backends))
    suite.named_backends = v.named_backends
    suite.single = single
    if known_backends is not None:
        check_params(suite)
    return suite


def check_params(suite: Suite) -> None:
    """Every value a sweep gives a backend parameter, checked against its declaration
    (``Backend.params``): the declaring backends the sweep runs, or any backend that declares
    it. The one check of those values; BadInput names file, key, value and what is allowed."""
    from attnbench.core.registry import all_backends

    declared: dict[str, list] = {}
    for b in all_backends().values():
        for name in getattr(b, "params", {}):
            declared.setdefault(name, []).append(b)
    for sweep in suite.sweeps:
        _check_own_params(suite, sweep, all_backends())
        for name, values in sweep.axes.items():
            owners = declared.get(name, [])
            mine = [b for b in owners if b.name in sweep.backends] or owners
            for b in mine:
                for value in values:
                    why = b.params[name].problem(value)
                    if why:
                        raise BadInput(f"{suite.path}: {suite.sweep_where(sweep)}axes.{name} = "
                                       f"{shown(value)}: a parameter of {b.name}; {why}")


def _check_own_params(suite: Suite, sweep: Sweep, known: dict) -> None:
    """[sweep.params.BACKEND]: each a parameter that backend declares, with allowed values."""
    for backend, table in sweep.params.items():
        b = known.get(backend)
        if b is None:  # an unknown name is check_backends' error
            continue
        for name, values in table.items():
            where = f"{suite.path}: {suite.sweep_where(sweep)}params.{backend}.{name}"
            if name not in b.params:
                raise BadInput(f"{where} = {shown(values[0])}: not a parameter of {backend}; "
                               f"allowed: {', '.join(b.params) or 'none (it declares none)'}")
            for value in values:
                why = b.params[name].problem(value)
                if why:
                    raise BadInput(f"{where} = {shown(value)}: {why}")


def _supports(backend: str, case: Case) -> bool:
    from attnbench.core.registry import get_backend
    return not get_backend(backend).not_supported_reasons(case)


def narrow_backends(suite: Suite, names: list[str] | None, device: str) -> Suite:
    """``--backends``: each sweep keeps the named backends it lists; a named backend that no
    sweep lists joins every sweep with a case it supports on ``device``, and runs only on
    those cases. Sweeps left empty are dropped. What changed goes to ``suite.notes``."""
    if names is None:
        return suite
    listed = {b for s in suite.sweeps for b in s.backends}
    unlisted = [b for b in names if b not in listed]
    kept, emptied = [], []
    joined: dict[str, list[str]] = {b: [] for b in unlisted}
    for sweep in suite.sweeps:
        backends = [b for b in sweep.backends if b in names]
        added = []
        if sweep.runs_on(device) and unlisted:  # lazily: the plan's size is not checked yet
            added = [b for b in unlisted if any(_supports(b, c.replace(device=device))
                                                for c in sweep.iter_cases())]
        for b in added:
            joined[b].append(sweep.name)
        if backends or added:
            sweep.backends = backends + added
            sweep.supported_only = tuple(added)
            kept.append(sweep)
        else:
            emptied.append(sweep.name)
    given = ",".join(names)
    if not kept:
        raise BadInput(f"--backends {given}: no sweep of suite {suite.name!r} lists them or "
                       f"has a case they support on {device}; its backends: "
                       f"{', '.join(suite.backends)}")
    suite.sweeps = kept
    if emptied:
        suite.notes.append(f"--backends {given}: left out sweeps listing none of them: "
                           f"{', '.join(emptied)}")
    for b, sweeps in joined.items():
        suite.notes.append(
            f"--backends {given}: {b} is listed by no sweep; " + (
                f"it runs on the cases it supports of sweeps {', '.join(sweeps)}" if sweeps
                else "no sweep has a case it supports, so it does not run"))
    return suite


def override_axes(suite: Suite, **axes) -> Suite:
    """Replace axis values in every sweep (CLI --dtype, --seq-len, --device); --backends
    narrows instead (``narrow_backends``)."""
    v = _Validator(Path("command line"), None)
    for sweep in suite.sweeps:
        for key, values in axes.items():
            if values is None:
                continue
            checked = [v.axis_value(key, x) for x in values]
            if key == "seq_len":
                for k in ("seq_q", "seq_k"):
                    sweep.axes.pop(k, None)
            sweep.axes[key] = checked
        bad = sweep.bounds_problem()
        if bad:
            raise BadInput(f"{suite.path}: sweep {sweep.name!r}: {bad[0]} = {shown(bad[1])} "
                           f"with the command line's lengths: {bad[2]}")
    return suite


def declared_comparisons(meta: dict) -> tuple[list[Comparison], str]:
    """The comparisons the run's suite declared: as recorded in meta.json, or (runs from
    before that) from its suite file as it is now; a note when neither can be read."""
    if isinstance(meta.get("comparisons"), list):  # recorded by the run itself
        return [dataclasses.replace(Comparison(**(d | {"backends": tuple(d["backends"])})),
                                    suite=meta.get("suite", ""))
                for d in meta["comparisons"]], ""
    source = meta.get("suite_path") or meta.get("suite")
    if not source:
        return [], ""
    candidates = [source] + ([meta["suite"]] if meta.get("suite") else [])
    for candidate in candidates:
        if candidate.endswith(".toml") and not Path(candidate).is_file():
            continue
        try:
            suite = load_suite(candidate)
        except BadInput:
            continue
        return [dataclasses.replace(c, suite=meta.get("suite") or suite.name)
                for c in suite.comparisons], ""
    return [], f"suite {source} could not be read; comparisons inferred from the records"
