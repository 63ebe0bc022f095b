"""One definition of each thing, checked by reading the sources: one significance rule
(``stats/significance.py``), one timing loop (``measure/timing.py`` and the GPU sample
methods it calls), one worker pool (``measure/worker.py``). Every exception is listed here
with the reason it is not a second one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = "src/attnbench"
TREES = (SRC, "implementations", "benchmarks", "scripts")


def sources() -> dict[str, str]:
    """Every Python file of the code trees, by its path from the repository root."""
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
            for tree in TREES for p in sorted((ROOT / tree).rglob("*.py"))
            if "__pycache__" not in p.parts}


def dotted(node: ast.AST) -> str:
    """``torch.cuda.Event`` for that attribute chain; ``?`` where a link is not a name."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return "?"


def names(text: str) -> list[str]:
    """Every name the code uses: attribute chains whole, imported modules and names (no
    comments or strings, so prose that names a clock or a test is never counted; the
    expressions inside f-strings are)."""
    tree = ast.parse(text)
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Name, ast.Attribute)) and id(node) not in inner:
            found.append(dotted(node))
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            found += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.keyword) and node.arg:
            found.append(f"{node.arg}=")
    return found


def matching(pattern: re.Pattern, text: str) -> int:
    return sum(bool(pattern.search(n)) for n in names(text))


# ---- one significance rule ---------------------------------------------------------------

# A rank or hypothesis test is a second rule beside the interval's.
HYPOTHESIS_TESTS = re.compile(r"(^|\.)(mannwhitneyu|ttest_\w+|wilcoxon|ks_2samp|kruskal|"
                              r"brunnermunzel|pvalue|p_value)$")
RULE = (f"{SRC}/stats/significance.py", "decide")


def _bound_vs_one(node: ast.Compare) -> bool:
    """``x.low > 1``, ``iv.high < 1``, ``iv.low >= 1 - t``: an interval's end against 1."""
    sides = [node.left, *node.comparators]
    bound = any(isinstance(s, ast.Attribute) and s.attr in ("low", "high", "lo", "hi")
                for s in sides)

    def one(s):
        if isinstance(s, ast.BinOp):
            s = s.left
        return isinstance(s, ast.Constant) and s.value == 1

    return bound and any(one(s) for s in sides)


def significance_sites() -> set[tuple[str, str]]:
    """(file, function) of every comparison of an interval's end with 1."""
    sites = set()
    for path, text in sources().items():
        tree = ast.parse(text)
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Compare) and _bound_vs_one(node):
                    sites.add((path, fn.name))
    return sites


def test_significance_is_decided_in_one_function():
    assert significance_sites() == {RULE}


def test_no_hypothesis_test_beside_the_interval():
    found = [p for p, text in sources().items() if matching(HYPOTHESIS_TESTS, text)]
    assert found == []


def test_min_samples_is_defined_once():
    found = [p for p, text in sources().items()
             if any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "MIN_SAMPLES"
                                                       for t in n.targets)
                    for n in ast.walk(ast.parse(text)))]
    assert found == [f"{SRC}/stats/significance.py"]


def test_the_scanner_sees_a_second_rule():
    tree = ast.parse("def f(iv):\n    return iv.low > 1 or iv.high <= 1.0 - t\n")
    assert sum(_bound_vs_one(n) for n in ast.walk(tree) if isinstance(n, ast.Compare)) == 2
    tree = ast.parse("def f(iv, low):\n    return iv.low >= low\n")
    assert not any(_bound_vs_one(n) for n in ast.walk(tree) if isinstance(n, ast.Compare))


# ---- one timing loop -----------------------------------------------------------------------

# A clock, a GPU event, or someone else's benchmark timer (by the names the code uses).
CLOCK = re.compile(r"(^|\.)(perf_counter(_ns)?|monotonic(_ns)?|process_time|do_bench|timeit)$"
                   r"|(^|\.)time\.time$|cuda\.Event$|^enable_timing=$|benchmark\.Timer$")
TIMING_LOOP = {f"{SRC}/measure/timing.py", f"{SRC}/measure/timing_methods.py"}
# Files that read a clock for something other than a sample: file -> (reads, why).
CLOCK_READERS = {
    f"{SRC}/measure/probe.py": (
        2, "the drift probe's rate between the loop's rounds, on the real clock even when "
           "a test fakes the loop's"),
    f"{SRC}/measure/execute.py": (2, "a pair's setup time (inputs, compile), once"),
    f"{SRC}/measure/correctness.py": (2, "a correctness task's duration in its row"),
    f"{SRC}/measure/device_state.py": (1, "the samplers' time base for energy and clocks"),
    f"{SRC}/runs/model_runner.py": (2, "a progress line's elapsed seconds"),
    "implementations/_triton_flash_kernels.py": (2, "how long the autotune took, once"),
    "implementations/_triton_varlen.py": (2, "how long the varlen autotune took, once"),
    "implementations/flex.py": (2, "the first call's compile time, once"),
    "scripts/gpu_report_cost.py": (2, "one whole command's wall time (a cost estimate)"),
    "scripts/gpu_correctness.py": (3, "elapsed seconds in its progress lines"),
}


def clock_reads() -> dict[str, int]:
    counts = {p: matching(CLOCK, text) for p, text in sources().items()}
    return {p: n for p, n in counts.items() if n}


def test_clocks_are_read_only_by_the_timing_loop_and_listed_setup_timers():
    """A clock read anywhere else is a second timing loop (or an unlisted timer): time
    calls with ``timing.measure_interleaved``, or list the file here with its reason."""
    reads = clock_reads()
    others = {p: n for p, n in reads.items() if p not in TIMING_LOOP}
    assert others == {p: n for p, (n, _) in CLOCK_READERS.items()}
    assert TIMING_LOOP <= set(reads)


def test_the_l2_flush_is_written_once():
    found = [p for p, text in sources().items()
             if any(isinstance(n, ast.FunctionDef) and n.name.startswith("l2_flush")
                    for n in ast.walk(ast.parse(text)))]
    assert found == [f"{SRC}/measure/timing_methods.py"]


def test_the_clock_pattern_sees_each_kind_of_timer():
    for line in ("t0 = time.perf_counter()", "s = torch.cuda.Event(enable_timing=True)",
                 "ms = triton.testing.do_bench(f)", "t = time.time()",
                 "torch.utils.benchmark.Timer(stmt)"):
        assert matching(CLOCK, line), line
    assert matching(CLOCK, "log(f'{time.perf_counter() - t0:.0f} s')") == 1
    assert matching(CLOCK, "# time.perf_counter in a comment\nx = 'do_bench'\n") == 0
    assert matching(CLOCK, "from time import perf_counter\nperf_counter()\n") == 2


# ---- one worker pool -------------------------------------------------------------------------

POOL = re.compile(r"^multiprocessing\b|ProcessPoolExecutor$|^concurrent\.futures\.process"
                  r"|^os\.fork$")
WORKER = f"{SRC}/measure/worker.py"
# Files that start processes otherwise: file -> why.
POOL_USERS = {
    "scripts/triton_resources.py": "a developer's tool that compiles every kernel variant "
                                   "once for its resource table; nothing is measured",
}


def test_processes_are_started_only_by_the_worker_module():
    found = {p for p, text in sources().items() if matching(POOL, text)}
    assert found == {WORKER, *POOL_USERS}
