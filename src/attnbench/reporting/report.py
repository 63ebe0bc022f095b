"""Reports: ``reports/<name>/index.md`` and a self-contained ``index.html``, comparison first.

Each comparison (declared in the suite, or inferred from backends that ran the same
problems) gets its panel set per dtype and mode: time, speedup over the baseline, TFLOP/s
against the measured ceiling, memory against its floor, error against the tolerance, and,
with approximate backends, error against time with the Pareto front. Then the tables:
winners per problem, exponents in N, crossovers, reasons records are not ok, the
environment. Every number comes from the records of the runs given.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from attnbench.analysis import comparisons
from attnbench.analysis.claims import claims_table, pooled_table
from attnbench.analysis.comparisons import Comparison
from attnbench.core import metrics
from attnbench.reporting import (
    device_state_table,
    document,
    findings,
    guide_lines,
    inputs_error,
    plots,
    tables,
    time_breakdown,
)
from attnbench.reporting.document import Bold, Bullets, Figure, Figures, Heading, Para, Table
from attnbench.runs import dataset
from attnbench.runs.record_files import write_atomic
from attnbench.runs.suite import declared_comparisons
from attnbench.stats import significance

FACET = ["dtype", "mode"]
CHART_KINDS = ("time", "speedup", "tflops", "memory", "error", "pareto")


def ceiling_check(df: pd.DataFrame) -> str | None:
    """Records above 100% of a measured ceiling mean the ceiling itself was low."""
    over = []
    for col, what in (("frac_matmul", "matmul rate"), ("frac_bandwidth", "copy bandwidth")):
        if col in df.columns:
            bad = df[(df["status"] == "ok") & (df[col] > 1.0)]
            if not bad.empty:
                over.append(f"{len(bad)} record(s) exceed the measured {what} (up to "
                            f"{bad[col].max():.0%})")
    if not over:
        return None
    return ("; ".join(over) + ". The ceiling measured at the "
            "start of the run was lower than what backends reached later (the machine was "
            "slower then, or the ceiling's workload is not the device's best); read those "
            "fractions as relative only.")


class Report:
    """The runs, their comparisons and what was drawn; ``blocks`` is the document."""

    def __init__(self, runs: list[dataset.Run], out_dir: Path):
        self.runs = runs
        self.out = out_dir
        self.df = dataset.combined(runs)
        self.palette = plots.Palette()
        self.files: list[str] = []
        self.claims = {r.label: r.meta.get("claims") or [] for r in runs}
        planned, self.notes = self._plan()
        # each comparison with its records and its speedups over the baseline
        self.planned = [(c, recs, findings.speedups(c, recs)) for c, recs in planned]

    def _plan(self) -> tuple[list[tuple[Comparison, pd.DataFrame]], list[str]]:
        declared, notes, seen = [], [], set()
        for run in self.runs:
            found, note = declared_comparisons(run.meta)
            if note:
                notes.append(f"{run.label}: {note}.")
            for c in found:
                if (c.suite, c.name) not in seen:
                    seen.add((c.suite, c.name))
                    declared.append(c)
        suites = "+".join(dict.fromkeys(r.suite for r in self.runs if r.suite))
        planned, more = comparisons.plan(self.df, declared, suites)
        return planned, notes + more

    # ---- headline ---------------------------------------------------------------------

    def headlines(self) -> list[str]:
        out = []
        for c, _, sp in self.planned:
            line = findings.comparison_headline(c, sp)
            if line:
                out.append(line)
        for run in self.runs:
            verdicts = findings.claim_verdicts(run.records.assign(run_id=run.label),
                                               self.claims[run.label])
            if verdicts:
                out.append(verdicts + (f" ({run.label})" if len(self.runs) > 1 else ""))
        pooled = self.pooled_claims()
        if not pooled.empty:
            counts = pooled["verdict"].value_counts()
            out.append(f"goals pooled over {len(self.runs)} runs: "
                       + ", ".join(f"{n} {v}" for v, n in counts.items()))
        for line in (findings.unsteady_headline(self.df), findings.coverage_headline(self.df)):
            if line:
                out.append(line)
        return out + inputs_error.headlines(self.df)

    # ---- charts -----------------------------------------------------------------------

    @staticmethod
    def chart_name(kind: str, c: Comparison, facet: tuple) -> str:
        """What the file shows: time--family-window-vs-causal--float32-fwd.png."""
        return plots.chart_file_name(
            f"{kind}--{c.slug}--{comparisons.slugify('-'.join(map(str, facet)))}")

    def _ceilings(self, recs: pd.DataFrame, dtype: str) -> dict[str, float]:
        present = set(recs["run_id"])
        out = {}
        for run in self.runs:
            value = guide_lines.matmul_ceiling(run.meta, dtype)
            if run.label in present and value:
                out[run.label] = value
        return out

    def panel_set(self, c: Comparison, recs: pd.DataFrame, sp: pd.DataFrame, facet: tuple
                  ) -> list[Figure]:
        dtype, mode = facet
        lines = tables.line_columns(recs)
        where = f"{dtype}, {mode}"
        title = f"{c.name} ({where})"
        if not sp.empty:
            sp = sp[(sp["dtype"] == dtype) & (sp["mode"] == mode)]
        baseline = c.baseline or ""
        if c.baseline and c.pair == "shape" and (c.where | c.baseline_where):
            baseline += " (" + ", ".join(f"{k}={v[0] if isinstance(v, list) else v}" for k, v in
                                         (c.where | c.baseline_where).items()) + ")"
        goals = list({g["text"]: g for cl in self.claims.values()
                      for g in findings.goals(c, cl)}.values())
        made = [
            ("time", "Median time against N, 95% interval bands",
             lambda p: plots.time_chart(recs, f"Time: {title}", p, lines, self.palette, where)),
            ("speedup", f"Speedup over {baseline} with 95% intervals",
             lambda p: plots.speedup_chart(
                 sp, f"Speedup over {baseline}: {title}", p, lines, baseline, goals,
                 self.palette, where) if c.baseline else None),
            ("tflops", "TFLOP/s against N, with the measured matmul ceiling",
             lambda p: plots.tflops_chart(recs, f"Throughput: {title}", p, lines,
                                          self._ceilings(recs, dtype), self.palette, where)),
            ("memory", "Peak memory against N, with the inputs+outputs floor and the N^2 "
                       "score matrix",
             lambda p: plots.memory_chart(recs, f"Memory: {title}", p, lines, self.palette,
                                          where)),
            ("error", "Error against the float64 evaluation, with the dtype's tolerance",
             lambda p: plots.error_chart(recs, f"Error: {title}", p, lines, self.palette,
                                         where)),
            ("pareto", "Error against time at each N, the Pareto front marked",
             lambda p: plots.pareto_chart(recs, f"Error vs time: {title}", p, lines,
                                          self.palette, where)
             if "semantics" in recs and (recs["semantics"] == "approximate").any() else None),
        ]
        figures = []
        for kind, caption, draw in made:
            name = self.chart_name(kind, c, facet)
            chart = draw(self.out / name)
            if chart is not None:
                self.files.append(name)
                figures.append(Figure(name, chart.alt, f"{caption}. ({name})"))
        return figures

    # ---- the document -----------------------------------------------------------------

    def blocks(self) -> list:
        names = ", ".join(r.label for r in self.runs)
        out: list = [Heading(1, f"attnbench report: {names}")]
        suites = ", ".join(dict.fromkeys(r.suite for r in self.runs if r.suite))
        out.append(Para([f"{len(self.df)} records from {len(self.runs)} run(s) of suite(s) ",
                         Bold(suites or "?"), ". Each comparison below has its panel set per "
                         "dtype and mode; every interval is 95%, paired where both sides were "
                         "timed in the same interleaved rounds, unless its coverage is written "
                         "next to it, as in [3.47, 4.47, 75%] (fewer than 6 samples cannot "
                         "reach 95%; such an interval is never called significant). Points "
                         "that are not ok are "
                         "marked with their status at the bottom of a chart."]))
        heads = self.headlines()
        if heads:
            out += [Heading(2, "Headline"), Bullets([[h] for h in heads])]
        out += self._environment()
        out += self._claims()
        out += inputs_error.blocks(self.df)
        for c, recs, sp in self.planned:
            out += self._comparison(c, recs, sp)
        out += time_breakdown.blocks(self)
        out += self._tables()
        return out

    def _environment(self) -> list:
        out = [Heading(2, "Runs and environment"),
               Table(device_state_table.extend(findings.environment(self.runs), self.runs),
                     "One column per run: the device, versions, the ceilings measured at the "
                     "start of the run, how steady the drift probe stayed, the commit.")]
        over = ceiling_check(self.df)
        if over:
            out.append(Para([Bold("Ceiling check failed: "), over]))
        out += [Para([n]) for n in self.notes]
        return out

    def _claims(self) -> list:
        out = []
        for run in self.runs:
            claims = self.claims[run.label]
            if not claims:
                continue
            if not out:
                out += [Heading(2, "Claims and measurements"),
                        Para(["Each claim is data in the suite; its measurement comes from the "
                              "run's ok records with a 95% interval ('paired' when both sides "
                              "were timed in the same interleaved rounds, else a bootstrap). "
                              "A claim decided by sequential rounds uses its stopping rule's "
                              "wider per-look interval instead, as its row says, so the "
                              "verdict is the one the rule stopped on. "
                              "'inconclusive': the interval straddles an expected bound."])]
            table = claims_table(run.records.assign(run_id=run.label), claims)
            out.append(Table(table.set_index("claim"), f"Run {run.label}"))
        pooled = self.pooled_claims()
        if not pooled.empty:
            out += [Heading(3, "Pooled over runs"),
                    Para(["Each claim measured in two or more runs, one estimate from all of "
                          "them: a random-effects (DerSimonian-Laird) combination of the "
                          "runs' log-ratios, which adds the spread between runs to each run's "
                          "own error, with a Hartung-Knapp interval (a t quantile on runs - 1 "
                          "degrees of freedom: few runs, wide intervals); the verdict is read "
                          "from the pooled interval. Runs that "
                          "take turns between verdicts near a bound converge here."]),
                    Table(pooled.set_index("claim"))]
        return out

    def pooled_claims(self) -> pd.DataFrame:
        if len(self.runs) < 2:
            return pd.DataFrame()
        return pooled_table([(r.label, r.records, self.claims[r.label]) for r in self.runs])

    def _comparison(self, c: Comparison, recs: pd.DataFrame, sp: pd.DataFrame) -> list:
        out = [Heading(2, f"Comparison {c.name}: {c.title}"), Para([c.describe()]),
               Para([f"Records: {tables.status_counts(recs)}."])]
        lines = tables.line_columns(recs)
        if not sp.empty and "speedup" in sp:
            n_paired = int(sp["speedup_method"].astype(str).str.startswith("paired").sum())
            n_ratio = int(sp["speedup"].notna().sum())
            out += [Heading(3, f"Speedup over {c.baseline}"),
                    Para([f"The baseline's time over each backend's, per size: for the "
                          f"{n_paired} of {n_ratio} pairs timed in the same rounds, the median "
                          f"of the per-round ratios (baseline's sample over the backend's, "
                          f"round by round; not the ratio of the two medians) with its "
                          f"order-statistics interval; for the others the ratio of the medians "
                          f"with a bootstrap interval. Intervals are 95% unless their coverage "
                          f"is written in them. '(n.s.)': not significant; "
                          f"{significance.RULE}."]),
                    Table(findings.speedup_table(sp, lines))]
            cross = findings.crossovers(sp, lines, c.baseline)
            if not cross.empty:
                out += [Heading(3, "Crossovers"),
                        Para(["Where a backend's speedup over the baseline crosses 1, "
                              "interpolated on log-log axes between the two sizes that "
                              "bracket it."]),
                        Table(cross)]
        for facet, g in recs.groupby(FACET, sort=False):
            figures = self.panel_set(c, g, sp, facet)
            if figures:
                out += [Heading(3, f"Charts: {c.name}, {' '.join(facet)}"), Figures(figures)]
        return out

    def _tables(self) -> list:
        df = self.df
        lines = tables.line_columns(df)
        out = []
        win = findings.winners(df, lines)
        if not win.empty:
            out += [Heading(2, "Winners per problem"),
                    Para(["For every problem (case) two or more backends ran: the fastest ok "
                          "backend, its margin over the runner-up (the runner-up's time over "
                          "the winner's, 95% interval) and whether the margin is significant: "
                          f"{significance.RULE}. Without a significant margin there is no "
                          "winner."]),
                    Table(win)]
        exps = findings.exponents(df, lines)
        if not exps.empty:
            out += [Heading(2, "Scaling: exponents in N"),
                    Para(["Slope of log(median time) and of log(peak memory above the inputs) "
                          "over log(N), per line with three or more square sizes; R^2 of the "
                          "log-log fit says how well one power law describes the line (1 is "
                          "perfect). The time exponent's interval is a bootstrap over each "
                          "size's samples."]),
                    Table(exps)]
        bad = findings.reasons(df)
        out.append(Heading(2, "Records that are not ok"))
        out.append(Table(bad, "Grouped by status, backend and reason.") if not bad.empty
                   else Para(["Every record is ok."]))
        out += self._metric_tables(df, lines)
        if "kernel" in df.columns and df["kernel"].notna().any():
            out += [Heading(2, "Kernel that ran"),
                    Para(["As recorded by the backend, once per case outside the timed region "
                          "(for sdpa: the ATen kernel PyTorch dispatched to)."]),
                    Table(tables.pivot(df[df["kernel"].notna()], "kernel", lines))]
        return out

    def _metric_tables(self, df: pd.DataFrame, lines: list[str]) -> list:
        out = [Heading(2, "Tables by metric"),
               Para([f"Rows: {', '.join(lines)}; columns: sequence length (seq_q/seq_k when "
                     f"they differ). Non-ok cells show the status; ~ marks a noisy record, "
                     f"WRONG a value above the tolerance. {tables.moving_caption(df)}".strip()])]
        for m in metrics.tabulated():
            if m.name not in df.columns or df[m.name].isna().all():
                continue
            d = df
            if m.name.startswith("err_vs_softmax") and "semantics" in df.columns:
                d = df[df["semantics"] == "approximate"]
                if d.empty:
                    continue
            out += [Heading(3, m.heading), Para([f"{m.how}."]),
                    Table(tables.pivot(d, m.name, lines))]
        return out


MANIFEST = ".attnbench-report.json"  # the files a build wrote: the only ones it may remove
DOCUMENTS = ("index.md", "index.html")


def _written_before(out: Path) -> list[str]:
    try:
        names = json.loads((out / MANIFEST).read_text(encoding="utf-8")).get("files", [])
    except (OSError, ValueError, AttributeError):
        return []  # no manifest (or not ours): nothing here is known to be ours
    return [n for n in names if isinstance(n, str) and n == Path(n).name]


def build_report(run_dirs: list[str | Path], out_dir: str | Path) -> Path:
    """Write the report into ``out_dir``. Charts an earlier build wrote (its manifest) and
    this one did not draw are removed; anything else in the folder is never touched."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = Report(dataset.load(run_dirs), out)
    blocks = report.blocks()
    for stale in set(_written_before(out)) - set(report.files) - set(DOCUMENTS):
        (out / stale).unlink(missing_ok=True)
    title = "attnbench report: " + ", ".join(r.label for r in report.runs)
    document.write(blocks, out, title)
    write_atomic(out / MANIFEST, json.dumps({"files": list(DOCUMENTS) + report.files},
                                            indent=1) + "\n")
    return out
