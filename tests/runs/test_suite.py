"""Suite loading, expansion and validation messages."""

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnbench.core.errors import BadInput
from attnbench.runs.suite import AXIS_KEYS, TIMING_KEYS, TOP_KEYS, load_suite, parse_suite

KNOWN = ["naive", "sdpa"]
GOOD = """
name = "tiny"
description = "test"
backends = ["naive", "sdpa"]
[timing]
budget_s = 0.01
[axes]
heads_q = 2
head_dim = 8
seq_len = [16, 32]
mask = ["none", "causal"]
mode = "fwd"
[[exclude]]
mask = "causal"
seq_len = 32
"""


def test_expansion_and_excludes(write_suite):
    suite = load_suite(str(write_suite(GOOD)), KNOWN)
    jobs = suite.jobs()
    keys = {(c.seq_q, c.mask, b) for c, b in jobs}
    assert (32, "causal", "naive") not in keys
    assert len(jobs) == 3 * 2
    # sizes rise within a line, every backend of a case together
    assert [b for _, b in jobs[:2]] == ["naive", "sdpa"]
    assert suite.timing.budget_s == 0.01
    assert all(c.heads_kv == 2 and c.head_dim_v == 8 for c, _ in jobs)


def test_sweeps_with_defaults_and_backend_excludes(write_suite):
    text = """
name = "multi"
[defaults]
head_dim = 8
heads_q = 2
[[sweep]]
backends = ["naive", "sdpa"]
[sweep.axes]
seq_len = [8, 16]
[[sweep.exclude]]
backend = "naive"
seq_len = 16
[[sweep]]
backends = ["sdpa"]
[sweep.axes]
seq_q = 4
seq_k = [8, 12]
mask = "window(2,0)"
"""
    jobs = load_suite(str(write_suite(text)), KNOWN).jobs()
    assert ("naive", 16) not in {(b, c.seq_q) for c, b in jobs}
    assert {(c.seq_q, c.seq_k) for c, b in jobs if c.mask == "window(2,0)"} == {(4, 8), (4, 12)}
    assert len(jobs) == 3 + 2


HEAD = 'name = "tiny"\nbackends = ["naive"]\n'


@pytest.mark.parametrize("text,expected", [
    (HEAD + '[axes]\nseq_len = 8\nmode = "fwd"', None),
    (HEAD + 'colour = "red"\n[axes]\nseq_len = 8',
     "tiny.toml: colour = 'red': unknown key; allowed: name, description"),
    (HEAD + "[axes]\nheads_q = 6\nheads_kv = 4\nseq_len = 8",
     "heads_q (6) must be a multiple of heads_kv (4)"),
    (HEAD + "[axes]\nseq_len = [16, 0]", "tiny.toml: axes.seq_len = 0: must be a positive integer"),
    (HEAD + '[axes]\nseq_len = "long"', "axes.seq_len = 'long': must be an integer"),
    (HEAD + '[axes]\nseq_len = 8\ndtype = "float8"',
     "axes.dtype = 'float8': unknown dtype; allowed: float64, float32, float16, bfloat16"),
    (HEAD + '[axes]\nseq_len = 8\nmask = "diagonal"', "axes.mask = 'diagonal': unknown mask"),
    (HEAD + '[axes]\nseq_len = 8\nmode = "train"',
     "axes.mode = 'train': unknown mode; allowed: fwd, bwd, fwd_bwd"),
    (HEAD + "[axes]\nseq_len = 8\nwidth = 3", "axes.width = 3: unknown key; allowed: batch"),
    ('name = "tiny"\nbackends = ["naive", "flashy"]\n[axes]\nseq_len = 8',
     "backends = 'flashy': unknown backend; allowed: naive, sdpa"),
    (HEAD + "[timing]\nbudget_s = -1\n[axes]\nseq_len = 8",
     "timing.budget_s = -1: must be a positive float"),
    (HEAD + "[timing]\ntarget_rel = 0.02\nnoise_threshold = 0.2\n[axes]\nseq_len = 8", None),
    (HEAD + "[timing]\nrewarm_s = 0\n[axes]\nseq_len = 8", None),  # one untimed call
    (HEAD + "[timing]\nrewarm_s = -0.01\n[axes]\nseq_len = 8",
     "timing.rewarm_s = -0.01: must be a non-negative float (at most 60)"),
    (HEAD + "[timing]\nnoise_threshold = -1\n[axes]\nseq_len = 8",
     "timing.noise_threshold = -1: must be a positive float"),
    (HEAD + "[timing]\nmin_reps = 2.5\n[axes]\nseq_len = 8",
     "timing.min_reps = 2.5: must be a positive int"),
    ('name = "tiny"\n[[sweep]]\nbackends = ["naive"]\n[sweep.axes]\nseq_len = 8\n'
     '[[sweep]]\nbackends = ["sdpa"]\n[sweep.axes]\nhead_dim = -8\nseq_len = 8',
     "tiny.toml: sweep[1].axes.head_dim = -8: must be a positive integer"),
    (HEAD + "[axes]\nseq_len = 8\nscale = [-0.125, 0.5]", None),  # negatives are allowed
    (HEAD + "[axes]\nseq_len = 8\nscale = 0", "axes.scale = 0: must be a finite nonzero number"),
    (HEAD + "[axes]\nseq_len = 8\nscale = inf",
     "axes.scale = inf: must be a finite nonzero number"),
])
def test_validation_messages(write_suite, text, expected):
    path = write_suite(text + "\n")
    if expected is None:
        assert load_suite(str(path), KNOWN).jobs()
        return
    with pytest.raises(BadInput) as err:
        load_suite(str(path), KNOWN)
    message = str(err.value)
    assert "\n" not in message
    assert expected in message


def test_malformed_toml_and_missing_file(write_suite, tmp_path):
    with pytest.raises(BadInput, match="not valid TOML"):
        load_suite(str(write_suite("name = [unclosed")), KNOWN)
    with pytest.raises(BadInput, match="suite file not found"):
        load_suite(str(tmp_path / "absent.toml"), KNOWN)
    with pytest.raises(BadInput, match="unknown suite 'nope'; known suites: .*quick"):
        load_suite("nope", KNOWN)


def test_shipped_suites_are_valid():
    from pathlib import Path

    from attnbench.core.registry import all_backends

    for path in sorted((Path(__file__).parents[2] / "suites").glob("*.toml")):
        suite = load_suite(str(path), sorted(all_backends()))
        assert suite.jobs(), path


def test_claims_are_validated_and_evaluated_from_records(write_suite):
    import pandas as pd

    from attnbench.analysis.claims import claims_table

    text = GOOD + """
[[claim]]
text = "sdpa is at least 2x faster than naive"
kind = "ratio"
numerator = "naive"
denominator = "sdpa"
expected = [2]
[[claim]]
text = "naive is quadratic"
kind = "exponent"
backend = "naive"
expected = [1.8, 2.2]
"""
    suite = load_suite(str(write_suite(text)), KNOWN)
    assert len(suite.claims) == 2
    rows = []
    for n in (256, 512, 1024):
        for backend, t in (("naive", 1e-6 * n**2), ("sdpa", 0.25e-6 * n**2)):
            rows.append({"key": f"k{n}", "backend": backend, "status": "ok", "seq_q": n,
                         "seq_k": n, "time_ms_median": t})
    table = claims_table(pd.DataFrame(rows), suite.claims)
    assert list(table["verdict"]) == ["holds", "holds"]
    measured = table["measured (95% interval)"]
    assert measured[0].startswith("4, 4, 4")  # no samples: the ratios are points
    assert measured[1].startswith("2 (")  # no samples: the exponent is a point too
    sided = {"text": "window vs causal", "kind": "ratio", "numerator": "sdpa",
             "denominator": "naive", "numerator_where": {"mask": "causal"},
             "denominator_where": {"mask": "window(3,0)"}}
    shape = {"batch": 1, "heads_q": 1, "heads_kv": 1, "seq_q": 64, "seq_k": 64, "head_dim": 8,
             "head_dim_v": 8, "dtype": "float32", "mode": "fwd", "status": "ok"}
    two = pd.DataFrame([shape | {"key": "a", "backend": "sdpa", "mask": "causal",
                                 "time_ms_median": 6.0},
                        shape | {"key": "b", "backend": "naive", "mask": "window(3,0)",
                                 "time_ms_median": 2.0}])
    assert claims_table(two, [sided])["measured (95% interval)"][0].startswith("3 ")
    # with samples, the verdict reads the interval: paired rounds give a tight one
    sided["expected"] = [2.5]
    steps = [1.0, 1.5, 2.0, 3.0, 1.2, 2.5, 1.1, 1.8, 2.2, 1.4]  # the machine drifting
    paired = two.assign(samples_ms=[[6.0 * s for s in steps], [2.0 * s for s in steps]],
                        pair_group="g")
    assert claims_table(paired, [sided])["verdict"][0] == "holds"
    sided["expected"] = [3.5]
    assert claims_table(paired, [sided])["verdict"][0] == "does not hold"
    # the same samples timed apart (no pair group): the bootstrap interval straddles 2.5
    sided["expected"] = [2.5]
    apart = paired.assign(pair_group=[None, None])
    assert claims_table(apart, [sided])["verdict"][0] == "inconclusive"
    bad = GOOD + '[[claim]]\ntext = "x"\nkind = "guess"\n'
    with pytest.raises(BadInput, match=r"claim\[0\].kind = 'guess': allowed: ratio, value"):
        load_suite(str(write_suite(bad, "bad.toml")), KNOWN)


# ---- derived axes ------------------------------------------------------------------------
DERIVED = """
name = "tied"
[derive]
batch = "1024 // seq_len"
[[sweep]]
backends = ["naive"]
[sweep.axes]
seq_len = [128, 256]
head_dim = [32, 64]
[sweep.derive]
heads_q = "256 // head_dim"
heads_kv = "max(1, heads_q // 4)"
"""


def test_derived_axes_follow_the_swept_ones(tmp_path):
    path = tmp_path / "tied.toml"
    path.write_text(DERIVED)
    cases = [c for c, _ in load_suite(str(path)).jobs()]
    got = {(c.seq_q, c.head_dim): (c.batch, c.heads_q, c.heads_kv) for c in cases}
    assert got == {(128, 32): (8, 8, 2), (256, 32): (4, 8, 2),
                   (128, 64): (8, 4, 1), (256, 64): (4, 4, 1)}


@pytest.mark.parametrize("line, message", [
    ('batch = "1024 / seq_len"', "'/' is not integer division; use //"),
    ('batch = "__import__(\'os\')"', "is not allowed"),
    ('batch = "seq_len.bit_length()"', "is not allowed"),
    ('batch = "64 // seq_len"', "gives 0 at seq_len=128; batch must be a positive integer"),
    ('batch = "heads"', "unknown name 'heads'; allowed: head_dim, seq_len"),
    ('batch = "seq_len // (head_dim - 32)"', "division by zero"),
    ('batch = 3', 'must be a non-empty string such as "16384 // seq_len"'),
    ('dtype = "1"', "derive.dtype = '1': unknown key"),
])
def test_bad_derived_axis_is_one_line_naming_the_key(tmp_path, line, message):
    path = tmp_path / "bad.toml"
    path.write_text(DERIVED.replace('batch = "1024 // seq_len"', line))
    with pytest.raises(BadInput) as err:
        load_suite(str(path)).jobs()
    text = str(err.value)
    assert "\n" not in text and str(path) in text and "derive." in text
    assert message in text, text


def test_derived_axis_given_twice_is_refused(tmp_path):
    path = tmp_path / "twice.toml"
    path.write_text(DERIVED.replace('heads_q = "256 // head_dim"',
                                    'heads_q = "256 // head_dim"\nhead_dim = "64"'))
    with pytest.raises(BadInput, match="head_dim is also given in axes; give it once"):
        load_suite(str(path))


def test_h200_suite_keeps_tokens_and_width_fixed_and_states_its_goals():
    suite = load_suite("h200")
    jobs = suite.jobs_on("cuda")
    for case, _ in jobs:  # a paged decode step sets its own batch and heads
        if not case.page_size:
            assert case.batch * case.seq_q == 16384 and case.heads_q * case.head_dim == 2048
    # cut anywhere, the run still holds the core: bf16 d=128, then d=64, come first
    first = [c for c, _ in jobs[:60]]
    assert {(c.dtype, c.head_dim) for c in first} == {("bfloat16", 128)}
    assert {c.dtype for c, _ in jobs[:120]} == {"bfloat16"}
    assert {g["numerator"] for g in suite.claims} >= {"sdpa_flash", "sdpa_cudnn", "triton_flash"}


SEQUENTIAL = GOOD + """
[[claim]]
text = "sdpa is at least 2x faster than naive"
kind = "ratio"
numerator = "naive"
denominator = "sdpa"
expected = [2]
rounds = {rounds}
"""


def test_a_claims_rounds_are_its_looks(write_suite):
    suite = load_suite(str(write_suite(SEQUENTIAL.format(rounds="[8, 16, 24, 32]"))), KNOWN)
    assert suite.claims[0]["rounds"] == [8, 16, 24, 32]


@pytest.mark.parametrize("rounds,fragments", [
    ("[8, 8]", ["claim[0].rounds = [8, 8]", "increasing whole numbers"]),
    ('"lots"', ["claim[0].rounds = 'lots'", "allowed: a list"]),
    ("[0, 4]", ["claim[0].rounds = [0, 4]", "1..1000"]),
    ("[3, 6, 9]", ["claim[0].rounds = [3, 6, 9]", "3 rounds cannot reach the 98.33%"]),
])
def test_a_bad_rounds_value_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, rounds,
                                                    fragments):
    from attnbench.cli import main

    path = tmp_path / "seq.toml"
    path.write_text(SEQUENTIAL.format(rounds=rounds))
    monkeypatch.chdir(tmp_path)
    code = main(["run", "--suite", str(path), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "seq.toml" in err and all(f in err for f in fragments), err
    assert not (tmp_path / "results").exists()


def test_rounds_belong_to_ratio_claims_and_one_set_of_looks(write_suite):
    value = GOOD + ('[[claim]]\ntext = "t"\nkind = "value"\nbackend = "sdpa"\n'
                    'expected = [1]\nrounds = [8, 16]\n')
    with pytest.raises(BadInput, match=r"claim\[0\].rounds = \[8, 16\]: only a ratio claim"):
        load_suite(str(write_suite(value)), KNOWN)
    two = SEQUENTIAL.format(rounds="[8, 16]") + SEQUENTIAL.format(rounds="[8, 24]")[len(GOOD):]
    with pytest.raises(BadInput, match="share one set of looks"):
        load_suite(str(write_suite(two)), KNOWN)


# ---- fuzzing: any suite either loads or fails with one BadInput line --------------------
scalars = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=12), st.booleans(), st.just(math.inf))


values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=8)


keys = st.sampled_from(list(AXIS_KEYS) + list(TIMING_KEYS) + ["junk", "backends", "name"])


tables = st.dictionaries(keys, values, max_size=6)


suites = st.fixed_dictionaries(
    {}, optional={"name": st.one_of(st.text(max_size=30), scalars),
                  "backends": st.one_of(st.lists(st.sampled_from(["naive", "sdpa", "nope"]),
                                                 max_size=3), scalars),
                  "axes": st.one_of(tables, scalars), "timing": st.one_of(tables, scalars),
                  "defaults": tables, "sweep": st.one_of(st.lists(tables, max_size=3), scalars),
                  "exclude": st.one_of(st.lists(tables, max_size=2), scalars),
                  "claim": st.one_of(st.lists(tables, max_size=2), scalars),
                  "colour": scalars})


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=suites)
def test_fuzzed_suites_load_or_fail_with_one_line(data):
    assert set(data) <= set(TOP_KEYS) | {"colour"}
    try:
        suite = parse_suite(data, Path("fuzz.toml"), ["naive", "sdpa"])
    except BadInput as exc:
        assert "\n" not in str(exc) and str(exc).startswith("fuzz.toml")
        return
    suite.jobs()  # a suite that loads expands into jobs without an exception
