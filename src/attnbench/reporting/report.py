"""Reports: ``reports/<name>/index.md`` and ``index.html``, answers first, with their SVG
charts beside them and the long tables in ``appendix.md`` and ``appendix.html``.

The page opens on its answers (per comparison: the fastest backend and by how much, where it
crosses over the baseline, how accurate it is), then the claims decided, the winners, and
each comparison (declared in the suite, or inferred from backends that ran the same
problems) with its panel set per dtype and mode: time, speedup over the baseline, TFLOP/s
against the measured ceiling, memory against its floor, error against the tolerance, and,
with approximate backends, error against time with the Pareto front. What was not measured
or left out is one collapsed line. The appendix holds the environment, exponents in N, the
records that are not ok and the tables by metric. Every number comes from the records of
the runs given; the same records give the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from attnbench.analysis import comparisons, machine_state, run_diff
from attnbench.analysis.claims import claims_table, pooled_table
from attnbench.analysis.comparisons import Comparison
from attnbench.core import metrics
from attnbench.core.record import DEVICE_COLUMNS
from attnbench.reporting import (
    answers,
    device_state_table,
    document,
    findings,
    guide_lines,
    inputs_error,
    panels,
    plots,
    sources,
    tables,
    time_breakdown,
)
from attnbench.reporting.document import (
    Bold,
    Bullets,
    Details,
    Figure,
    Figures,
    Heading,
    Link,
    Para,
    Table,
)
from attnbench.runs import dataset
from attnbench.runs.record_files import write_atomic
from attnbench.runs.suite import declared_comparisons
from attnbench.stats import pooling, run_to_run, significance

FACET = ["dtype", "mode"]
CHART_BUDGET = 900_000  # bytes of charts in one report, before kinds are left out
REPORT_BUDGET = 1_500_000  # bytes of one report folder, pages and charts


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
        # every run's noise flag by the current rule, with its reasons (the appendix lists them)
        self.df = findings.noise_rechecked(dataset.combined(runs), {
            r.label: r.meta.get("timing") or {} for r in runs})
        self.palette = plots.Palette()
        self.files: list[str] = []
        self.claims = {r.label: [sources.cited(c) for c in r.meta.get("claims") or []]
                       for r in runs}
        self.drawn: list[tuple[str, str, Figures]] = []  # (kind, file, where it is shown)
        self.left_out: dict[str, int] = {}  # chart kind -> charts left out for the budget
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
        """The answers: per comparison, fastest, by how much, crossover, accuracy; then the
        goals' verdicts and what limits the numbers."""
        out = []
        for c, recs, sp in self.planned:
            line = answers.comparison_answer(c, recs, sp)
            if line:
                out.append(line)
        for run in self.runs:
            verdicts = self.verdicts(run)
            if verdicts:
                out.append(verdicts + (f" ({run.label})" if len(self.runs) > 1 else ""))
        pooled = self.pooled_claims()
        if not pooled.empty:
            counts = pooled["verdict"].value_counts()
            out.append(f"goals pooled over {len(self.runs)} runs: "
                       + ", ".join(f"{n} {v}" for v, n in counts.items()))
        out += self.machine_lines()
        for line in (answers.dense_layout_text(self.df), findings.unsteady_headline(self.df),
                     findings.coverage_headline(self.df)):
            if line:
                out.append(line)
        return out + inputs_error.headlines(self.df)

    def machine_lines(self) -> list[str]:
        """Where the machine moved beyond what two runs may differ by: during a run (the
        drift probe's level over its quarters), or between runs of one device read
        together (runs of different devices are compared on purpose, not replicates)."""
        device = run_diff.run_device(self.df)
        out = [machine_state.within_run_text(run.label, moved, device) for run in self.runs
               if (moved := machine_state.within_run(run.records, device)) is not None]
        if len(self.runs) > 1 and len({r.device for r in self.runs}) == 1:
            moved = machine_state.between_runs([(r.meta, r.records) for r in self.runs],
                                               device)
            if moved is not None:
                out.append(machine_state.between_runs_text(
                    moved, [run_diff.matmul_ceilings(r.meta) for r in self.runs], device))
        return out

    def verdicts(self, run: dataset.Run) -> str | None:
        return findings.claim_verdicts(run.records.assign(run_id=run.label),
                                       self.claims[run.label])

    def short_headline(self) -> str:
        """One line of at most ``answers.INDEX_WIDTH`` characters, for the index."""
        pooled = self.pooled_claims()
        if not pooled.empty:
            verdicts = f"goals pooled over {len(self.runs)} runs: " + ", ".join(
                f"{n} {v}" for v, n in pooled["verdict"].value_counts().items())
        else:
            verdicts = self.verdicts(self.runs[0]) if self.runs else None
        return answers.short_headline(self.planned, verdicts)

    # ---- charts -----------------------------------------------------------------------

    @staticmethod
    def chart_name(kind: str, c: Comparison, facet: tuple) -> str:
        """What the file shows: time--family-window-vs-causal--float32-fwd.svg."""
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
                  ) -> list[tuple[str, Figure]]:
        """The registered panels that apply to one comparison's records of one dtype and
        mode, drawn: (kind, figure) each."""
        dtype, mode = facet
        if not sp.empty:
            sp = sp[(sp["dtype"] == dtype) & (sp["mode"] == mode)]
        baseline = c.baseline or ""
        if c.baseline and c.pair == "shape" and (c.where | c.baseline_where):
            baseline += " (" + ", ".join(f"{k}={v[0] if isinstance(v, list) else v}" for k, v in
                                         (c.where | c.baseline_where).items()) + ")"
        goals = list({g["text"]: g for cl in self.claims.values()
                      for g in findings.goals(c, cl)}.values())
        view = panels.View(c.name, f"{dtype}, {mode}", recs, sp, tables.line_columns(recs),
                           self.palette, baseline, goals, self._ceilings(recs, dtype))
        figures = []
        for panel in panels.registered():
            if not panel.applies(view):
                continue
            name = self.chart_name(panel.name, c, facet)
            chart = panel.draw(view, self.out / name)
            if chart is not None:
                self.files.append(name)
                figures.append((panel.name, Figure(name, chart.alt,
                                                   f"{panel.caption(view)}. ({name})")))
        return figures

    # ---- the document -----------------------------------------------------------------

    def blocks(self) -> list:
        """The main page; ``fit_budget`` and ``finish_aside`` run after it (charts are
        drawn as the blocks are made)."""
        names = ", ".join(r.label for r in self.runs)
        out: list = [Heading(1, f"attnbench report: {names}")]
        suites = ", ".join(dict.fromkeys(r.suite for r in self.runs if r.suite))
        devices = ", ".join(dict.fromkeys(r.device for r in self.runs))
        out.append(Para([f"{len(self.df)} records from {len(self.runs)} run(s) of suite(s) ",
                         Bold(suites or "?"), f" on {devices}. Every interval is 95%, paired "
                         "where both sides were timed in the same interleaved rounds, unless "
                         "its coverage is written next to it, as in [3.47, 4.47, 75%]. "
                         f"Speedups, winners' margins, claims of one run and exponents: "
                         f"{self.interval_legend()}; figures pooled over runs: Hartung-Knapp "
                         "(the runs' own spread, no allowance on top); times: within run "
                         "(this run's samples only). One "
                         "that reaches further than its value from it reads 'too noisy to "
                         "say'. Points that are not ok are marked with their status at the "
                         "bottom of a chart. The environment, exponents in N, records that "
                         "are not ok and the tables by metric are in the ",
                         Link("appendix", "appendix.html", "appendix.md"), "."]))
        heads = self.headlines()
        if heads:
            out += [Heading(2, "Answers"), Bullets([[h] for h in heads])]
        self.aside = Details("", [[n] for n in self.notes])
        out.append(self.aside)
        over = ceiling_check(self.df)
        if over:
            out.append(Para([Bold("Ceiling check failed: "), over]))
        out += self._claims()
        out += self._winners()
        out += inputs_error.blocks(self.df)
        for c, recs, sp in self.planned:
            out += self._comparison(c, recs, sp)
        out += time_breakdown.blocks(self)
        return out

    def interval_legend(self) -> str:
        """Which interval a ratio carries: across runs, with the device kind's allowance."""
        device = self.df["device"].dropna().iloc[0] if "device" in self.df.columns and \
            self.df["device"].notna().any() else None
        return run_to_run.legend(device)

    def finish_aside(self) -> None:
        """The collapsed line's summary: how many things were not measured or left out."""
        said = []
        unmeasured = sum(1 for item in self.aside.items
                         if str(item[0]).startswith("claim not measured"))
        if unmeasured:
            said.append(f"{unmeasured} claim(s) not measured")
        if self.notes:
            said.append(f"{len(self.notes)} note(s) on comparisons left out")
        if self.left_out:
            n = sum(self.left_out.values())
            kinds = ", ".join(f"{k} {panels.label(kind)}" for kind, k in self.left_out.items())
            said.append(f"{n} chart(s) left out to keep the report small ({kinds})")
            self.aside.items.append([f"{n} chart(s) left out ({kinds}): the report would "
                                     f"pass its size budget ({CHART_BUDGET // 1000} kB of "
                                     f"charts, {REPORT_BUDGET // 1000} kB in all), so the "
                                     f"least needed kinds were dropped; their numbers are in "
                                     f"the appendix's tables."])
        self.aside.summary = "Not shown: " + "; ".join(said) if said else ""

    def appendix(self) -> list:
        names = ", ".join(r.label for r in self.runs)
        out: list = [Heading(1, f"attnbench report appendix: {names}"),
                     Para(["The long tables behind the ", Link("report", "index.html",
                                                               "index.md"), "."])]
        out += self._environment()
        out += self._tables()
        return out

    def _environment(self) -> list:
        return [Heading(2, "Runs and environment"),
                Table(device_state_table.extend(findings.environment(self.runs), self.runs),
                      "One column per run: the device, versions, the ceilings measured at "
                      "the start of the run, how steady the drift probe stayed, the commit.")]

    def _claims(self) -> list:
        out = []
        for run in self.runs:
            claims = self.claims[run.label]
            if not claims:
                continue
            if not out:
                out += [Heading(2, "Claims decided"),
                        Para(["Each claim is data in the suite; its measurement comes from the "
                              "run's ok records with a 95% interval ('paired' when both sides "
                              "were timed in the same interleaved rounds, else a bootstrap), "
                              "widened to the across-runs interval so that a rerun keeps the "
                              f"verdict ({self.interval_legend()}: the record's for a time or "
                              "a rate, the ratio's for a ratio or a fraction of a ceiling "
                              "measured in the run, the slope's share of the ratio's for an "
                              "exponent). A claim decided by sequential rounds uses its "
                              "stopping rule's wider per-look interval instead (the allowance "
                              "scaled to that level), as its row says. "
                              "'inconclusive': the interval straddles an expected bound."])]
            table = claims_table(run.records.assign(run_id=run.label), claims)
            missing = table["verdict"] == "not measured"
            where = f" ({run.label})" if len(self.runs) > 1 else ""
            self.aside.items += [[f"claim not measured{where}: {r['claim']}"]
                                 for _, r in table[missing].iterrows()]
            if (~missing).any():
                out.append(Table(table[~missing].set_index("claim"), f"Run {run.label}"))
        pooled = self.pooled_claims()
        if not pooled.empty:
            out += [Heading(3, "Pooled over runs"),
                    Para(["Each claim measured in two or more runs, one estimate from all of "
                          "them: a random-effects (DerSimonian-Laird) combination of the "
                          "runs' log-ratios, which adds the spread between runs to each run's "
                          "own error, with a Hartung-Knapp interval (a t quantile on runs - 1 "
                          "degrees of freedom: few runs, wide intervals) of the runs' "
                          "within-run intervals (their own scatter is the between-run part, so "
                          "no allowance is added); the verdict is read "
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
                          f"with a bootstrap interval, each widened by the between-run "
                          f"allowance ({self.interval_legend()}). Intervals are 95% unless "
                          f"their coverage is written in them. '(n.s.)': not significant; "
                          f"{significance.RULE}."]),
                    Table(findings.speedup_table(sp, lines))]
            cross = findings.crossovers(sp, lines, c.baseline)
            if not cross.empty:
                out += [Heading(3, "Crossovers"),
                        Para(["Where a backend's speedup over the baseline crosses 1, "
                              "interpolated on log-log axes between the two sizes that "
                              "bracket it."]),
                        Table(cross)]
        out += self._clocks(recs, lines)
        for facet, g in recs.groupby(FACET, sort=False):
            drawn = self.panel_set(c, g, sp, facet)
            if drawn:
                shown = Figures([f for _, f in drawn])
                self.drawn += [(kind, f.file, shown) for kind, f in drawn]
                out += [Heading(3, f"Charts: {c.name}, {' '.join(facet)}"), shown]
        return out

    @staticmethod
    def _clocks(recs: pd.DataFrame, lines: list[str]) -> list:
        """Time beside the device's clock, where the records carry one: a slow figure may
        be a lower clock rather than the code."""
        clock = tables.clock_column(recs)
        if clock is None:
            return []
        return [Heading(3, "Time and clock"),
                Para([f"Median time (ms) with its 95% interval, and the clock it was measured "
                      f"at ({clock}: {DEVICE_COLUMNS[clock]})."]),
                Table(tables.pivot(recs, "time_ms_median", lines, clock))]

    def fit_budget(self, budget: int | None = None) -> None:
        """Past ``budget`` bytes of charts, leave out the least needed kinds, whole kinds
        at a time (a report never shows throughput for some comparisons only), in the order
        of the panels' priorities."""
        budget = CHART_BUDGET if budget is None else budget

        def size() -> int:
            return report_size(self.out, self.files)

        for kind in panels.least_needed():
            if size() <= budget:
                return
            for k, name, shown in [d for d in self.drawn if d[0] == kind]:
                shown.figures = [f for f in shown.figures if f.file != name]
                self.files.remove(name)
                (self.out / name).unlink(missing_ok=True)
                self.drawn.remove((k, name, shown))
                self.left_out[kind] = self.left_out.get(kind, 0) + 1

    def _winners(self) -> list:
        lines = tables.line_columns(self.df)
        # replicates on one device pool; runs on different devices keep a row each
        pooled = len(self.runs) > 1 and "run_id" in lines and \
            len({r.device for r in self.runs}) == 1
        win = findings.pooled_winners(self.df, lines) if pooled else \
            findings.winners(self.df, lines)
        if win.empty:
            return []
        how = ("For every problem (case) two or more backends ran: the fastest ok "
               "backend, its margin over the runner-up (the runner-up's time over the "
               "winner's, 95% interval) and whether the margin is significant: "
               f"{significance.RULE}. Without a significant margin there is no winner.")
        if pooled:
            how += (f" One row per problem over the {len(self.runs)} runs: the winner has the "
                    "lowest median of the runs' median times, 'won in' counts the runs it "
                    "was fastest in, and the margin pools the runs' intervals (" +
                    pooling.describe(len(self.runs)) + ").")
        return [Heading(2, "Winners per problem"), Para([how]), Table(win)]

    def _tables(self) -> list:
        df = self.df
        lines = tables.line_columns(df)
        out = []
        exps = findings.exponents(df, lines)
        if not exps.empty:
            out += [Heading(2, "Scaling: exponents in N"),
                    Para(["Slope of log(median time) and of log(peak memory above the inputs) "
                          "over log(N), per line with three or more square sizes; R^2 of the "
                          "log-log fit says how well one power law describes the line (1 is "
                          "perfect). The time exponent's interval is a bootstrap over each "
                          "size's samples, widened by the slope's share of the between-run "
                          f"allowance ({self.interval_legend()})."]),
                    Table(exps)]
        noisy = findings.noisy_records(df, lines)
        if not noisy.empty:
            out += [Heading(2, "Records flagged noisy"),
                    Para([f"{len(noisy)} of {int((df['status'] == 'ok').sum())} ok records, "
                          "each with the check that flagged it and by how much: 'probe' (the "
                          "drift probe's level moved within the record's group beyond its "
                          "own jitter), 'spread' (the samples scatter more than the larger of "
                          "the run's floor and twice the probe's scatter), 'samples' (the "
                          "record's own interval reaches past the run's limit). Decided by "
                          "the current rule from each record's samples and probe readings."]),
                    Table(noisy)]
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
        present = [m for m in metrics.tabulated()
                   if m.name in df.columns and not df[m.name].isna().all()]
        shown = {m.name for m in present}
        for m in present:
            if FOLDED.get(m.name) in shown:
                continue  # in brackets in its rate's table
            d = df
            if m.name.startswith("err_vs_softmax") and "semantics" in df.columns:
                d = df[df["semantics"] == "approximate"]
                if d.empty:
                    continue
            table = tables.pivot(d, m.name, lines)
            heading, how = m.heading, f"{m.how}."
            share = next((metrics.get(f) for f, rate in FOLDED.items()
                          if rate == m.name and f in shown), None)
            if share is not None:
                table = tables.folded(table, tables.pivot(d, share.name, lines))
                heading += f", in brackets: {share.heading[0].lower()}{share.heading[1:]}"
                how += f" In brackets: {share.how}."
            out += [Heading(3, heading), Para([how]), Table(table)]
        return out


# a share of a measured ceiling, shown in brackets beside the rate it divides (one table
# per rate, not two with the same rows)
FOLDED = {"frac_matmul": "tflops", "frac_bandwidth": "gbps",
          "err_doc_out_len": "err_doc_out_rel"}


MANIFEST = ".attnbench-report.json"  # the files a build wrote: the only ones it may remove
DOCUMENTS = ("index.md", "index.html", "appendix.md", "appendix.html")


def _manifest(out: Path) -> dict:
    try:
        found = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _written_before(out: Path) -> list[str]:
    names = _manifest(out).get("files", [])  # no manifest (or not ours): nothing is ours
    return [n for n in names if isinstance(n, str) and n == Path(n).name] \
        if isinstance(names, list) else []


def runs_of(out: Path) -> list[str]:
    """The run folders' names a report was built from (its manifest), [] when unknown."""
    names = _manifest(out).get("runs", [])
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def report_size(out: Path, files: list[str]) -> int:
    return sum((out / n).stat().st_size for n in files if (out / n).is_file())


def build_report(run_dirs: list[str | Path], out_dir: str | Path) -> Path:
    """Write the report into ``out_dir``. Charts an earlier build wrote (its manifest) and
    this one did not draw are removed; anything else in the folder is never touched."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = Report(dataset.load(run_dirs), out)
    blocks = report.blocks()
    appendix = report.appendix()
    pages = sum(len(text.encode()) for text in (
        document.to_markdown(blocks), document.to_html(blocks, out, ""),
        document.to_markdown(appendix), document.to_html(appendix, out, "")))
    report.fit_budget(min(CHART_BUDGET, REPORT_BUDGET - pages))
    report.finish_aside()
    blocks = [b for b in blocks if not (isinstance(b, Details) and not b.summary)]
    for stale in set(_written_before(out)) - set(report.files) - set(DOCUMENTS):
        (out / stale).unlink(missing_ok=True)
    names = ", ".join(r.label for r in report.runs)
    document.write(blocks, out, "attnbench report: " + names)
    document.write(appendix, out, "attnbench report appendix: " + names, "appendix")
    files = list(DOCUMENTS) + sorted(report.files)
    write_atomic(out / MANIFEST, json.dumps({"files": files,
                                             "runs": [Path(d).name for d in run_dirs]},
                                            indent=1) + "\n")
    return out
