"""`attnbench compare` on hand-made runs with known samples: three answers (worse/better,
unchanged, cannot tell), no verdict under 6 samples a side, the machine's move separated
from the code, and the gate's exit codes. No timing is measured: every sample is injected."""

from __future__ import annotations

import json

import numpy as np
import pytest
from run_command import run

from attnbench.cli import main
from attnbench.stats import intervals, significance

BACKENDS = ("sdpa", "naive", "linear")
SIZES = (256, 512, 1024, 2048)


def _records(n: int = 3, scale: dict | None = None, status: str = "ok") -> list[dict]:
    """One record per (backend, size): n samples around a base time, times ``scale``."""
    scale = scale or {}
    rng = np.random.default_rng(7)
    out = []
    for b in BACKENDS:
        for i, size in enumerate(SIZES):
            base = (1 + i) * (2.0 if b == "naive" else 1.0)
            s = [float(x) * scale.get(b, 1.0) for x in base * rng.lognormal(0, 0.02, n)]
            rec = {"run_id": "r", "key": f"n{size}", "backend": b, "status": status,
                   "seq_q": size, "seq_k": size, "backend_hash": f"h-{b}"}
            if status == "ok":
                rec |= {"time_ms_median": float(np.median(s)), "samples_ms": s}
            else:
                rec["reason"] = "RuntimeError: boom"
            out.append(rec)
    return out


def _write(path, records) -> str:
    path.mkdir()
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "meta.json").write_text(json.dumps({"run_id": path.name}))
    return str(path)


def test_three_times_slower_at_n6_is_worse_not_unchanged(tmp_path, capsys):
    """The interval of the ratio of medians excludes 1 from 6 samples a side, and the other
    backends (same code) show the machine did not move."""
    base = _write(tmp_path / "base", _records(6))
    new = _write(tmp_path / "new", _records(6, {"sdpa": 3.0}))
    assert main(["compare", base, new, "--fail-on-regression"]) == 1
    out = capsys.readouterr().out
    assert out.count("REGRESSION sdpa") == 4 and "REGRESSION naive" not in out
    assert "4 worse" in out and "unchanged" not in out.split("REGRESSION")[0].split("sdpa")[1]


def test_a_machine_slower_for_everyone_is_named_and_flags_no_backend(tmp_path, capsys):
    base = _write(tmp_path / "base", _records(6))
    new = _write(tmp_path / "new", _records(6, {b: 1.3 for b in BACKENDS}))
    assert main(["compare", base, new, "--fail-on-regression"]) == 0
    out = capsys.readouterr().out
    assert "the machine moved 1.3x" in out and "0 worse" in out
    # judged on raw ratios, every record reads worse
    assert main(["compare", base, new, "--fail-on-regression", "--absolute"]) == 1
    assert "12 worse" in capsys.readouterr().out


def test_too_few_samples_cannot_tell_and_the_gate_can_fail_on_it(tmp_path, capsys):
    base = _write(tmp_path / "base", _records(2))
    new = _write(tmp_path / "new", _records(2, {"sdpa": 1.15}))
    assert main(["compare", base, new, "--fail-on-regression", "--absolute"]) == 0
    assert "12 cannot tell" in capsys.readouterr().out
    assert main(["compare", base, new, "--fail-on-cannot-tell", "--absolute"]) == 1
    assert "CANNOT TELL sdpa n256" in capsys.readouterr().out


def test_every_pair_broke_exits_1_listing_them(tmp_path, capsys):
    """Base all ok, new all error (so no record of the new run has the metric): a gate
    failure listing the regressions (1), not bad input (2)."""
    base = _write(tmp_path / "base", _records(3))
    new = _write(tmp_path / "new", _records(3, status="error"))
    assert main(["compare", base, new, "--fail-on-regression"]) == 1
    out = capsys.readouterr().out
    assert out.count("REGRESSION") == 12 and "ok -> error" in out and "12 broke" in out


@pytest.mark.parametrize("new_scale,expected", [
    (3.0, "worse"), (1 / 3.0, "better"), (1.0, "unchanged"), (1.15, "cannot tell")])
def test_change_verdict_answers(new_scale, expected):
    base = [10.0, 10.1, 9.9, 10.05, 9.95, 10.02]
    new = [x * new_scale for x in (10.0, 10.1, 9.9, 10.05, 9.95, 10.02)]
    if expected == "cannot tell":  # a wide spread straddling the 10% threshold
        new = [9.0, 14.0, 11.0, 10.0, 13.0, 12.5]
    iv = intervals.ratio_interval(new, base)
    verdict = significance.decide(iv, 0.1, lower_is_better=True)
    assert verdict == expected, iv


def test_when_the_backends_disagree_the_probe_tells_the_machine(tmp_path, capsys):
    """Two backends, one 3x slower: the backends alone cannot say whether the machine or
    the code moved; the drift probe (unchanged) says the machine did not."""
    def two(scale):
        return [r | {"probe_gflops": 100.0} for r in _records(6, scale)
                if r["backend"] in ("sdpa", "naive")]

    base = _write(tmp_path / "base", two({}))
    new = _write(tmp_path / "new", two({"sdpa": 3.0}))
    assert main(["compare", base, new, "--fail-on-regression"]) == 1
    out = capsys.readouterr().out
    assert "the machine moved 1x" in out and "the drift probe" in out
    assert out.count("REGRESSION sdpa") == 4 and "REGRESSION naive" not in out


def test_compare_counts_what_is_missing(tiny, tmp_path, capsys):
    out = tmp_path / "results"
    assert run("--suite", str(tiny), "--out", str(out), "--run-id", "A") == 0
    assert run("--suite", str(tiny), "--out", str(out), "--run-id", "B",
               "--backends", "naive") == 0
    assert run("--suite", str(tiny), "--out", str(out), "--run-id", "C", "--backends",
               "sdpa", "--seq-len", "64") == 0
    capsys.readouterr()
    a, b, c = (str(out / x) for x in "ABC")
    assert main(["compare", a, c, "--fail-on-regression"]) == 1
    assert "nothing was compared" in capsys.readouterr().out
    # two runs timed minutes apart on a loaded machine can really differ by more than 10%
    # (compare has the power to see it at n = 3): this test is about missing pairs, so a
    # threshold no timing noise reaches
    loose = ["--threshold", "100"]
    assert main(["compare", a, b, "--fail-on-regression", *loose]) == 1
    assert "missing: 2 pair(s) of the base run" in capsys.readouterr().out
    assert main(["compare", a, b, "--fail-on-regression", "--allow-missing", *loose]) == 0
