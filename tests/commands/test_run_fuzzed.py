"""Fuzzing: generated suites, valid and hostile, through the command line.

Every suite must be answered with exit 0 (a plan) or exit 2 and one line under 300
characters, never a traceback or a hang, and nothing may be written outside the temporary
folder. In process (``attnbench.cli.main`` with ``--dry-run``) for speed; a few through a
subprocess as a user would run them.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnbench.cli import main

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "1000"))
HANG_S = 60  # per suite: far beyond any answer; only a hang reaches it

AXES = ["batch", "heads_q", "heads_kv", "seq_len", "seq_q", "seq_k", "head_dim", "head_dim_v",
        "dtype", "mask", "mode", "seed", "device", "block_size", "block_band", "scale",
        "block_pairs", "feature_map", "additive_dim", "num_features", "linformer_k"]
NAMES = AXES + ["backend", "name", "heads", "x", "", "seq_len ", "__class__"]
TIMING = ["warmup_s", "rewarm_s", "budget_s", "min_reps", "max_reps", "timeout_s", "target_rel",
          "noise_threshold", "processes", "slow_dtype_factor", "bogus"]
BACKENDS = ["naive", "sdpa", "linear", "additive", "nope", ""]
WORDS = ["none", "causal", "window(16,0)", "window(-1,2)", "block_sparse(local)", "fwd",
         "bwd", "fwd_bwd", "float32", "bfloat16", "float8", "cpu", "cuda", "auto", "tpu",
         "elu", "x" * 400]
EXPRESSIONS = ["16384 // seq_len", "max(seq_len)", "min(1, seq_len)", "seq_len / 2",
               "seq_len - 100000", "0 - seed", "heads_q // 4", "__import__('os')",
               "seq_len ** 99", "9" * 300, "seq_len // (head_dim - head_dim)", "batch",
               "max(1, seq_len) * 10**14", "", "seq_len.real", "(" * 500]

scalars = st.one_of(
    st.integers(-5, 300), st.sampled_from([0, 2**31, 2**62, -(2**63)]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(WORDS),
    st.booleans(), st.text(max_size=12))
values = st.one_of(scalars, st.lists(scalars, max_size=3),
                   st.lists(st.lists(st.integers(-1, 4), max_size=3), max_size=2),
                   st.dictionaries(st.sampled_from(NAMES), scalars, max_size=2))
hostile_tables = st.dictionaries(st.sampled_from(NAMES), values, max_size=3)


def one_or_list(strategy):
    return st.one_of(strategy, st.lists(strategy, min_size=1, max_size=3, unique=True))


GOOD = {  # values a suite may hold, so that most suites reach the later checks
    "batch": one_or_list(st.integers(1, 4)), "heads_q": one_or_list(st.sampled_from([1, 2, 4])),
    "heads_kv": one_or_list(st.sampled_from([1, 2])), "seq_len": one_or_list(
        st.sampled_from([8, 16, 32, 64])), "head_dim": one_or_list(st.sampled_from([8, 16])),
    "dtype": one_or_list(st.sampled_from(["float32", "bfloat16", "float64"])),
    "mask": one_or_list(st.sampled_from(["none", "causal", "window(4,0)"])),
    "mode": one_or_list(st.sampled_from(["fwd", "bwd", "fwd_bwd"])),
    "seed": one_or_list(st.integers(0, 3)), "block_band": st.integers(0, 2),
    "scale": st.sampled_from([0.5, -1.0, 2]),
}
# an axis is usually good, sometimes any value at all
axis_value = {k: st.one_of(v, v, v, v, v, v, v, values) for k, v in GOOD.items()}
good_axes = st.fixed_dictionaries({"seq_len": axis_value["seq_len"]}, optional={
    k: v for k, v in axis_value.items() if k != "seq_len"})
huge = st.builds(lambda a, b, n: {a: {"__range__": n}, b: {"__range__": n}},
                 st.sampled_from(["batch", "seed", "heads_q"]),
                 st.sampled_from(["seed", "block_band", "additive_dim"]),
                 st.sampled_from([10, 400, 2000]))
excludes = st.lists(st.one_of(st.dictionaries(st.sampled_from(list(GOOD) + ["backend"]),
                                              st.sampled_from([1, 2, 16, 32, "naive", "fwd",
                                                               "causal", "float32"]),
                                              max_size=2), hostile_tables), max_size=2)
claims = st.lists(st.fixed_dictionaries(
    {"text": st.one_of(st.just("a claim"), values),
     "kind": st.one_of(st.sampled_from(["ratio", "value", "exponent"]), values)},
    optional={"backend": st.one_of(st.sampled_from(BACKENDS), values),
              "numerator": st.sampled_from(BACKENDS), "denominator": st.sampled_from(BACKENDS),
              "metric": st.one_of(st.sampled_from(["time_ms_median", "tflops", "x"]), values),
              "expected": st.one_of(st.just([1.0, 2.0]), st.just([0.5]), values),
              "scale": st.one_of(st.just(1000), values), "where": st.one_of(
                  st.just({"seq_len": 16}), values), "unit": values, "zzz": values,
              "rounds": st.one_of(st.just([8, 16]), st.just([2, 4]), values)}),
    max_size=2)


def pick(rng, p: float, hostile, usual):
    """``hostile`` with probability p, else ``usual``: hypothesis favours its first and
    smallest choices, so a seeded coin keeps most suites valid enough to reach the later
    checks while every hostile value still comes up."""
    return hostile if rng.random() < p else usual


@st.composite
def suites(draw) -> dict:
    rng = random.Random(draw(st.integers(0, 2**63)))  # its coin: a stream from a drawn seed
    backends = st.lists(st.sampled_from(BACKENDS[:4]), min_size=1, max_size=3, unique=True)
    suite = {"name": draw(pick(rng, 0.05, st.one_of(st.text(max_size=300), scalars),
                               st.just("fuzz")))}
    if rng.random() > 0.03:
        suite["backends"] = draw(pick(rng, 0.05, values, backends))
    axes = draw(pick(rng, 0.2, st.builds(lambda a, b: a | b, good_axes, hostile_tables),
                     good_axes))
    if rng.random() < 0.1:
        axes |= draw(huge)
    form = rng.random()
    if form < 0.15:  # [[sweep]] tables (with defaults)
        suite["defaults"] = draw(pick(rng, 0.2, hostile_tables, st.just({"head_dim": 8})))
        suite["sweep"] = [{"backends": draw(backends), "axes": axes} | draw(pick(
            rng, 0.3, st.dictionaries(st.sampled_from(["name", "devices", "exclude", "zzz"]),
                                      st.one_of(st.just(["cpu"]), values), max_size=2),
            st.just({})))]
    elif form < 0.97:
        suite["axes"] = axes
    if rng.random() < 0.25:
        suite["derive"] = draw(st.dictionaries(st.sampled_from(NAMES), st.one_of(
            st.sampled_from(EXPRESSIONS), values), max_size=2))
    if rng.random() < 0.25:
        suite["exclude"] = draw(excludes)
    if rng.random() < 0.25:
        suite["timing"] = draw(st.dictionaries(st.sampled_from(TIMING), pick(
            rng, 0.3, scalars, st.sampled_from([0.001, 1, 10])), max_size=3))
    if rng.random() < 0.2:
        suite["claim"] = draw(claims)
    if rng.random() < 0.03:
        suite[draw(st.sampled_from(["zzz", "comparison", "description"]))] = draw(values)
    return suite


def toml_value(v) -> str:
    if isinstance(v, dict):
        if "__range__" in v:  # a long axis, written compactly here
            return "[" + ", ".join(str(i) for i in range(1, v["__range__"] + 1)) + "]"
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) \
            else repr(v)
    if isinstance(v, int):
        return str(v)
    return json.dumps(v, ensure_ascii=False)  # a TOML basic string


def toml_key(k: str) -> str:
    return json.dumps(k, ensure_ascii=False)


def to_toml(suite: dict) -> str:
    """Tables after plain keys, arrays of tables as [[name]]: enough TOML for suites."""
    plain = {k: v for k, v in suite.items() if not isinstance(v, (dict, list))
             or (isinstance(v, list) and not (v and all(isinstance(x, dict) for x in v)))}
    lines = [f"{toml_key(k)} = {toml_value(v)}" for k, v in plain.items()]
    for k, v in suite.items():
        if k in plain:
            continue
        if isinstance(v, dict):
            lines.append(f"[{toml_key(k)}]")
            lines += [f"{toml_key(a)} = {toml_value(x)}" for a, x in v.items()]
        else:
            for item in v:
                lines.append(f"[[{toml_key(k)}]]")
                lines += [f"{toml_key(a)} = {toml_value(x)}" for a, x in item.items()]
    return "\n".join(lines) + "\n"


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"no answer within {HANG_S} s")


def check_answer(code: int, out: str, err: str) -> None:
    assert code in (0, 2), (code, err)
    assert "Traceback" not in err
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("attnbench: error: "), err
        assert len(lines[0]) < 300, lines[0]
    else:
        assert out.startswith("plan: "), out


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_generated_suites_get_a_clean_answer(sandbox, capsys):
    codes = []

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(suite=suites())
    def answer(suite):
        (sandbox / "fuzz.toml").write_text(to_toml(suite))
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(HANG_S)
        try:
            code = main(["run", "--suite", "fuzz.toml", "--dry-run", "--no-progress"])
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
        captured = capsys.readouterr()
        check_answer(code, captured.out, captured.err)
        assert sorted(p.name for p in sandbox.iterdir()) == ["fuzz.toml", "home"]
        assert not any((sandbox / "home").iterdir())
        codes.append(code)

    answer()
    assert len(codes) >= EXAMPLES
    # the generator reaches both answers: plans, and refusals of every kind
    assert codes.count(0) >= EXAMPLES // 20 and codes.count(2) >= EXAMPLES // 2


HOSTILE = {  # the trial's cases, as a user's shell would run them
    "max": ('backends = ["naive"]\n[axes]\nseq_len = [16]\n[derive]\nbatch = "max(seq_len)"\n',
            2, "max() takes two or more arguments"),
    "huge": ('backends = ["naive"]\n[axes]\nseq_len = [16]\nbatch = '
             f'{list(range(1, 1001))}\nseed = {list(range(1000))}\n', 0,
             "would be refused without --force: at least 1000000 pairs"),
    "long value": ('backends = ["naive"]\n[axes]\nseq_len = ["' + "9" * 100_000 + '"]\n', 2,
                   "axes.seq_len"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_suites_through_a_subprocess(name, sandbox):
    text, expected_code, fragment = HOSTILE[name]
    (sandbox / "s.toml").write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "ATTNBENCH_PLUGINS"}
    proc = subprocess.run([sys.executable, "-m", "attnbench", "run", "--suite", "s.toml",
                           "--dry-run"], cwd=sandbox, env=env, capture_output=True, text=True,
                          timeout=300)
    check_answer(proc.returncode, proc.stdout, proc.stderr)
    assert proc.returncode == expected_code
    assert fragment in (proc.stdout + proc.stderr)
    assert sorted(p.name for p in sandbox.iterdir()) == ["home", "s.toml"]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(argv=st.lists(st.sampled_from(["--seq-len", "--dtype", "--backends", "--threads",
                                      "--device", "--retry", "0", "-1", "", "x", "16",
                                      "float32", "naive", "1e9", "cuda", ","]), max_size=6))
def test_fuzzed_command_lines_dry_run(tmp_path_factory, argv):
    out = tmp_path_factory.mktemp("fuzz") / "results"
    try:
        code = main(["run", "--dry-run", "--out", str(out), "--suite", "quick", *argv])
    except SystemExit as exc:  # argparse: usage error, exit 2
        code = exc.code
    assert code in (0, 2)
    assert not out.exists()
