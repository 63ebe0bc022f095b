"""What the report concludes from records, as tables: speedups against a comparison's
baseline, winners per problem with their margin and its significance, fitted exponents in N,
crossover lengths, the reasons records are not ok, the environment, and a headline.

Every ratio and its interval come from ``ratios`` (paired rounds when the records share
them), every fit from ``fits``; lines are ``tables.line_columns`` lines.
"""

from __future__ import annotations

from collections import Counter

import pandas as pd

from attnbench.analysis.claims import claims_table
from attnbench.analysis.comparisons import Comparison
from attnbench.core.record import speed_records, timed_under
from attnbench.measure.budget import TimingBudget
from attnbench.measure.ceilings import copy_ladder
from attnbench.reporting import lines as line_groups
from attnbench.reporting import tables
from attnbench.reporting.interval_text import ratio_text
from attnbench.reporting.plots import n_label
from attnbench.runs.dataset import Run
from attnbench.stats import fits, noise, pooling, ratios, run_to_run, significance
from attnbench.stats.intervals import Interval, coverage_note, short_of_level

DASH = "-"


# ---- speedups against a comparison's baseline -----------------------------------------


def speedups(c: Comparison, df: pd.DataFrame) -> pd.DataFrame:
    """One row per record on the backends' side (its own columns), with the baseline's time
    over its time (``speedup``, ``speedup_low/high``, ``significant``, ``speedup_method``)
    where both are ok; ``baseline_status`` says what the partner was ('missing': none)."""
    if c.baseline is None:
        return pd.DataFrame()
    rows, paired = [], set()
    for base, other in c.pairs(df):
        row = dict(other)
        row["baseline_status"] = base["status"]
        paired.add((other["run_id"], other["key"], other["backend"]))
        under = timed_under(base) or timed_under(other)
        if under:
            row["timed_under"] = under
        elif base["status"] == "ok" and other["status"] == "ok":
            within = ratios.difference(base, other)
            d = across_runs(within, other.get("device"), base, other)
            row.update(within_low=within.interval.low, within_high=within.interval.high,
                       within_method=within.interval.method, speedup=d.interval.estimate,
                       speedup_low=d.interval.low,
                       speedup_high=d.interval.high, significant=d.significant,
                       speedup_confidence=d.interval.confidence,
                       speedup_method=d.interval.method, significance=d.describe())
        rows.append(row)
    for _, other in c.backend_records(df).iterrows():
        if (other["run_id"], other["key"], other["backend"]) not in paired:
            rows.append(dict(other) | {"baseline_status": "missing"})
    return pd.DataFrame(rows)


def across_runs(d: ratios.Difference, device, *records) -> ratios.Difference:
    """A ratio of two records of one run with its across-runs interval (the within-run one
    widened by the ratio allowance and by each of ``records``' unsteadiness, as
    ``noise_rechecked`` measured it), significant by the one rule on that interval: a
    speedup or a margin a rerun keeps."""
    known = [float(u) for r in records
             if (u := r.get("unsteadiness")) is not None and pd.notna(u)]
    wide = run_to_run.across_runs(d.interval, device, "ratio", *known)
    return ratios.Difference(wide, significance.differs(wide))


def _ratio_cell(r) -> str:
    if timed_under(r):
        return f"timed under {timed_under(r)}: not a speed"
    if pd.notna(r.get("speedup")):
        iv_text = ratio_text(_interval(r))
        return iv_text + ("" if r["significant"] else " (n.s.)")
    if r["status"] != "ok":
        return r["status"]
    if r["baseline_status"] == "missing":
        return "no baseline"
    return f"baseline {r['baseline_status']}"


def _interval(r) -> Interval:
    conf = r.get("speedup_confidence")
    return Interval(r["speedup"], r["speedup_low"], r["speedup_high"],
                    0.95 if conf is None or pd.isna(conf) else float(conf), 2,
                    r.get("speedup_method", ""))


def _within(r) -> Interval:
    """A speedup row's within-run interval: what pooling over runs combines (it adds the
    runs' own spread, so the across-runs allowance would count it twice)."""
    iv = _interval(r)
    if pd.isna(r.get("within_low")):
        return iv
    return Interval(iv.estimate, float(r["within_low"]), float(r["within_high"]),
                    iv.confidence, iv.n, str(r.get("within_method", "")))


def speedup_table(sp: pd.DataFrame, lines: list[str]) -> pd.DataFrame:
    """Rows: the backends' lines; columns: N; cells: speedup [95% interval, its coverage
    when below 95%], '(n.s.)' when not significant, or why there is none."""
    if sp.empty:
        return pd.DataFrame()
    names = line_groups.shown(sp, [c for c in lines if c in sp.columns])
    rows = {}
    for line, g in line_groups.groups(sp, names):
        cells = {tables.seq_label(r): _ratio_cell(r) for _, r in g.iterrows()}
        rows[tuple(str(line[c]) for c in names)] = cells
    order = [tables.seq_label(r) for _, r in sp.drop_duplicates(["seq_q", "seq_k"])
             .sort_values(["seq_q", "seq_k"]).iterrows()]
    table = pd.DataFrame.from_dict(rows, orient="index").reindex(columns=order).fillna("")
    table.index = pd.MultiIndex.from_tuples(list(rows), names=names)
    return table


def crossovers(sp: pd.DataFrame, lines: list[str], baseline: str) -> pd.DataFrame:
    """Where each backend's speedup over the baseline crosses 1 (log-log interpolation
    between the bracketing sizes), or that it does not within the sizes measured."""
    if sp.empty or "speedup" not in sp:
        return pd.DataFrame()
    ok = sp[sp["speedup"].notna() & (sp["seq_q"] == sp["seq_k"])]
    names = line_groups.shown(sp, [c for c in lines if c in sp.columns])
    rows = []
    for line, g in line_groups.groups(ok, names):
        g = g.sort_values("seq_q")
        span = f"N = {n_label(int(g['seq_q'].min()))}..{n_label(int(g['seq_q'].max()))}"
        base = {c: line[c] for c in names}
        found = fits.crossings(g["seq_q"], g["speedup"])
        if not found:
            faster = bool((g["speedup"] > 1).all())
            rows.append(base | {"crossover N": DASH, "between": span,
                                "what happens": f"{'faster' if faster else 'slower'} than "
                                                f"{baseline} at every size measured",
                                "both sides significant": DASH})
            continue
        by_n = g.set_index("seq_q")
        for cross in found:
            sig = bool(by_n.loc[cross.below, "significant"]) and bool(
                by_n.loc[cross.above, "significant"])
            what = f"overtakes {baseline}" if cross.rising else f"falls behind {baseline}"
            rows.append(base | {"crossover N": f"~{cross.n:.0f}",
                                "between": f"{n_label(cross.below)} and {n_label(cross.above)}",
                                "what happens": what,
                                "both sides significant": "yes" if sig else "no"})
    return pd.DataFrame(rows)


def goals(c: Comparison, claims: list[dict]) -> list[dict]:
    """Ratio claims on this comparison's time ratios, as speedups over its baseline (a claim
    stated the other way round is inverted), to draw on the speedup chart."""
    out = []
    for cl in claims:
        if cl.get("kind") != "ratio" or cl.get("metric", ratios.SAMPLED) != ratios.SAMPLED:
            continue
        exp = cl.get("expected") or []
        if not exp:
            continue
        low, high = exp[0], (exp[1] if len(exp) > 1 else None)
        if cl["numerator"] == c.baseline and cl["denominator"] in c.backends:
            backend = cl["denominator"]
        elif cl["denominator"] == c.baseline and cl["numerator"] in c.backends:
            backend = cl["numerator"]
            low, high = (1 / high if high else None), (1 / low if low else None)
            if low is None:
                low, high = high, None
        else:
            continue
        sizes = cl.get("where", {}).get("seq_len")
        sizes = sizes if isinstance(sizes, list) else ([sizes] if sizes else [])
        bound = f">= {low:.3g}x" if high is None else f"{low:.3g}-{high:.3g}x"
        at = f" at N = {', '.join(map(str, sizes))}" if sizes else ""
        out.append({"backend": backend, "low": low, "high": high, "sizes": sizes,
                    "text": f"{backend} {bound}{at} ({cl.get('source') or 'claim'})"})
    return out


# ---- winners per problem ----------------------------------------------------------------


def winners(df: pd.DataFrame, lines: list[str]) -> pd.DataFrame:
    """Per problem (run and case) that two or more backends ran: the fastest ok one, its
    margin over the runner-up with the interval, and whether the margin is significant
    (``significance.differs``: the interval excludes 1, from enough samples). A problem
    whose margin is not significant has no winner: the column names the two that tie."""
    problem = [c for c in lines if c not in ("backend",) and c in df.columns]
    rows = []
    for (_, _), g in df.groupby(["run_id", "key"], sort=False):
        if g["backend"].nunique() < 2:
            continue
        first = g.iloc[0]
        row = {"run_id": first["run_id"]} if "run_id" in problem else {}
        row |= {"N": tables.seq_label(first), "dtype": first["dtype"], "mode": first["mode"],
                "mask": first["mask"]}
        row |= {c: first[c] for c in problem if c not in row}
        ok = speed_records(g[(g["status"] == "ok") & g["time_ms_median"].notna()]).sort_values(
            "time_ms_median")
        rest = [f"{r['backend']} {r['status']}" for _, r in g[g["status"] != "ok"].iterrows()]
        rest += [f"{r['backend']} timed under {timed_under(r)}" for _, r in g.iterrows()
                 if r["status"] == "ok" and timed_under(r)]
        if ok.empty:
            rows.append(row | {"winner": DASH, "time (ms)": DASH, "runner-up": DASH,
                               "margin [95% interval]": DASH, "significant": DASH,
                               "others": "; ".join(rest)})
            continue
        w = ok.iloc[0]
        row |= {"winner": w["backend"], "time (ms)": f"{w['time_ms_median']:.4g}"}
        if len(ok) < 2:
            row |= {"runner-up": DASH, "margin [95% interval]": "only ok record",
                    "significant": DASH}
        else:
            r = ok.iloc[1]
            # runner-up's time over the winner's, across runs
            d = across_runs(ratios.difference(r, w), w.get("device"), r, w)
            if not d.significant:
                row["winner"] = f"no winner ({w['backend']} or {r['backend']})"
            row |= {"runner-up": r["backend"],
                    "margin [95% interval]": ratio_text(d.interval),
                    "significant": d.describe()}
            rest = [f"{o['backend']} {o['time_ms_median'] / w['time_ms_median']:.3g}x"
                    for _, o in ok.iloc[2:].iterrows()] + rest
        rows.append(row | {"others": "; ".join(rest)})
    return pd.DataFrame(rows)


def pooled_winners(df: pd.DataFrame, lines: list[str]) -> pd.DataFrame:
    """``winners`` over several runs of the same problems, one row per problem: the winner
    is the backend with the lowest median over runs of its ok times, its margin over the
    runner-up pooled from each run's interval (``pooling.random_effects``), significant by
    the one rule on the pooled interval; 'won in' counts the runs each was fastest in."""
    problem = [c for c in lines if c not in ("backend", "run_id") and c in df.columns]
    runs = df["run_id"].nunique()
    rows = []
    for _, g in df.groupby("key", sort=False):
        if g["backend"].nunique() < 2:
            continue
        first = g.iloc[0]
        row = {"N": tables.seq_label(first), "dtype": first["dtype"], "mode": first["mode"],
               "mask": first["mask"]}
        row |= {c: first[c] for c in problem if c not in row}
        ok = speed_records(g[(g["status"] == "ok") & g["time_ms_median"].notna()])
        rest = [f"{b} {s} ({n} of {runs} runs)" for (b, s), n in
                g[g["status"] != "ok"].groupby(["backend", "status"]).size().items()]
        times = ok.groupby("backend")["time_ms_median"].median().sort_values()
        if times.empty:
            rows.append(row | {"winner": DASH, "won in": DASH, "time (ms)": DASH,
                               "runner-up": DASH, "margin [95% interval]": DASH,
                               "significant": DASH, "others": "; ".join(rest)})
            continue
        best = ok.loc[ok.groupby("run_id")["time_ms_median"].idxmin(), "backend"]
        w = times.index[0]
        row |= {"winner": w, "won in": f"{int((best == w).sum())} of {runs} runs",
                "time (ms)": f"{times.iloc[0]:.4g}"}
        if len(times) < 2:
            rows.append(row | {"runner-up": DASH, "margin [95% interval]": "only ok backend",
                               "significant": DASH, "others": "; ".join(rest)})
            continue
        r = times.index[1]
        per_run = [ratios.ratio_interval(b.iloc[0], a.iloc[0])
                   for _, (a, b) in _sides(ok, w, r)]
        pooled = pooling.random_effects(per_run)
        if pooled is None:
            margin, significant = "fewer than 2 runs with an interval", "n/a"
        else:
            margin = ratio_text(pooled.interval)
            differs = significance.differs(pooled.interval)
            significant = "yes" if differs else "no"  # how it was pooled: the caption
            if not differs:
                row["winner"] = f"no winner ({w} or {r})"
        rest = [f"{b} {t / times.iloc[0]:.3g}x" for b, t in times.iloc[2:].items()] + rest
        rows.append(row | {"runner-up": r, "margin [95% interval]": margin,
                           "significant": significant, "others": "; ".join(rest)})
    return pd.DataFrame(rows)


def _sides(ok: pd.DataFrame, a: str, b: str):
    """Per run holding ok records of both backends: (run, (a's records, b's records))."""
    for run, g in ok.groupby("run_id", sort=False):
        ra, rb = g[g["backend"] == a], g[g["backend"] == b]
        if not ra.empty and not rb.empty:
            yield run, (ra, rb)


# ---- exponents -------------------------------------------------------------------------


def exponent_fits(df: pd.DataFrame, lines: list[str]) -> list[tuple[dict, fits.PowerLaw,
                                                                    object, object]]:
    """Per line with 3 or more square sizes: (line, the time fit, the across-runs interval
    of its exponent (a bootstrap, widened by the slope's allowance), the peak-memory fit or
    None)."""
    ok = df[(df["status"] == "ok") & (df["seq_q"] == df["seq_k"])
            & df["time_ms_median"].notna()]
    names = line_groups.shown(df, [c for c in lines if c in df.columns])
    out = []
    for line, g in line_groups.groups(ok, names):
        t = fits.power_law(g["seq_q"], g["time_ms_median"])
        if t is None:
            continue
        mem = g[g["peak_mem_bytes"].notna() & (g["peak_mem_bytes"] > 0)] \
            if "peak_mem_bytes" in g else g.iloc[0:0]
        m = fits.power_law(mem["seq_q"], mem["peak_mem_bytes"]) if not mem.empty else None
        iv = fits.exponent_interval(g)
        device = g["device"].dropna().iloc[0] if "device" in g and g["device"].notna().any() \
            else None
        out.append((line, t, iv and fits.exponent_across_runs(iv, g["seq_q"], device), m))
    return out


def exponents(df: pd.DataFrame, lines: list[str]) -> pd.DataFrame:
    """The exponents of time and peak memory in N per line, with their fits' R^2 (1 is a
    perfect power law) and the time exponent's 95% interval (across runs)."""
    rows = []
    for line, t, iv, m in exponent_fits(df, lines):
        rows.append(line | {
            "N": f"{n_label(t.n_min)}..{n_label(t.n_max)}", "sizes": t.points,
            "time exponent [95% interval]": _exponent_text(t.exponent, iv),
            "time fit R^2": f"{t.r2:.3f}",
            "memory exponent": f"{m.exponent:.2f}" if m else DASH,
            "memory fit R^2": f"{m.r2:.3f}" if m else DASH})
    return pd.DataFrame(rows)


def _exponent_text(exponent: float, iv: Interval) -> str:
    """'2.01 [1.98, 2.04]', with the coverage when few samples leave it below 95%."""
    note = coverage_note(iv.confidence)
    return f"{exponent:.2f} [{iv.low:.2f}, {iv.high:.2f}{', ' + note if note else ''}]"


# ---- statuses, environment -------------------------------------------------------------


def reasons(df: pd.DataFrame) -> pd.DataFrame:
    """Records that are not ok, grouped by status, backend and reason: how many, and where."""
    bad = df[df["status"] != "ok"]
    if bad.empty:
        return pd.DataFrame()
    rows = []
    for (status, backend, reason), g in bad.groupby(
            [bad["status"], bad["backend"], bad["reason"].fillna("")], sort=False):
        sizes = sorted(set(int(n) for n in g["seq_q"]))
        where = [f"N {', '.join(n_label(n) for n in sizes)}"]
        for c in ("dtype", "mask", "mode"):
            where.append(", ".join(sorted(set(map(str, g[c])))))
        if g["run_id"].nunique() > 1 or df["run_id"].nunique() > 1:
            where.append("runs: " + ", ".join(sorted(set(g["run_id"]))))
        rows.append({"status": status, "backend": backend, "records": len(g),
                     "reason": reason or DASH, "where": "; ".join(where)})
    order = {s: i for i, s in enumerate(("unavailable", "unsupported", "oom", "skipped",
                                         "wrong", "error", "crashed", "timeout"))}
    return pd.DataFrame(rows).sort_values(["status", "backend"],
                                          key=lambda s: s.map(order) if s.name == "status"
                                          else s).reset_index(drop=True)


def _copy_ceilings(meta: dict) -> str:
    """Copy bandwidth per copied size, largest first: ``GB/s: 12.3 (128 MiB copied), 40.1 (1 MiB
    copied)``."""
    ceilings = meta.get("ceilings") or {}
    ladder = copy_ladder(ceilings)[::-1]
    if not ladder:
        return f"{ceilings['copy_gbps']:.3g} GB/s" if ceilings.get("copy_gbps") else DASH
    return "GB/s: " + ", ".join(f"{g:.3g} ({n / 2**20:g} MiB copied)" for n, g in ladder)


def _ceilings(meta: dict) -> str:
    c = meta.get("ceilings") or {}
    mm = ", ".join(f"{k} {v:.3g}" for k, v in (c.get("matmul_tflops") or {}).items())
    return f"{mm} TFLOP/s" if mm else DASH


def _probe(meta: dict) -> str:
    p = meta.get("probe") or {}
    if not p.get("n"):
        return "not recorded"
    spread = (f"spread {p['spread']:.0%} of its median" if p.get("spread") is not None
              else "one reading, no spread")
    return (f"{p['gflops_min']:.3g}-{p['gflops_max']:.3g} GFLOP/s, {spread}; "
            f"{p.get('noisy_records', 0)} record(s) flagged noisy when recorded (the "
            f"report decides the flag again: see its records flagged noisy)")


def _ranks(meta: dict) -> str:
    """A sharded run's ranks (torchrun): where each measured, with its own ceilings."""
    entries = meta.get("ranks") or []
    return "; ".join(f"rank {e.get('rank')}: {e.get('host')} {e.get('device')}, "
                     f"{(e.get('environment') or {}).get('threads')} threads, "
                     f"{_ceilings(e)}" for e in entries) or DASH


def environment(runs: list[Run]) -> pd.DataFrame:
    """One column per run: device, capability, versions, ceilings, probe spread, commit."""
    def field(run: Run, key: str) -> str:
        v = run.env.get(key)
        return DASH if v in (None, "") else str(v)

    fields = {
        "run id": lambda r: r.run_id,
        "suite": lambda r: r.suite or DASH,
        "device": lambda r: f"{field(r, 'device_name')} ({field(r, 'device')})",
        "CPU capability": lambda r: field(r, "cpu_capability"),
        "GPU capability": lambda r: field(r, "gpu_capability"),
        "threads": lambda r: field(r, "threads"),
        "ranks (torchrun)": lambda r: _ranks(r.meta),
        "torch": lambda r: field(r, "torch"),
        "triton": lambda r: field(r, "triton"),
        "CUDA / driver": lambda r: f"{field(r, 'cuda')} / {field(r, 'driver')}",
        "xformers": lambda r: field(r, "xformers"),
        "python / numpy": lambda r: f"{field(r, 'python')} / {field(r, 'numpy')}",
        "platform": lambda r: field(r, "platform"),
        "commit": lambda r: r.commit,
        "started / ended": lambda r: f"{r.meta.get('started') or DASH} / "
                                     f"{r.meta.get('ended') or DASH}",
        "matmul ceiling": lambda r: _ceilings(r.meta),
        "copy bandwidth": lambda r: _copy_ceilings(r.meta),
        "drift probe": lambda r: _probe(r.meta),
        "records": lambda r: tables.status_counts(r.records) if not r.records.empty else "0",
    }
    table = pd.DataFrame({r.label: {k: f(r) for k, f in fields.items()} for r in runs})
    if (table.loc["ranks (torchrun)"] == DASH).all():  # no run was sharded
        table = table.drop(index="ranks (torchrun)")
    table.index.name = "field"
    return table


# ---- headline --------------------------------------------------------------------------


def comparison_headline(c: Comparison, sp: pd.DataFrame) -> str | None:
    """At the largest size with a ratio: the fastest backend against the baseline. Over
    several runs, each (case, backend)'s runs are pooled first (``pooling``) and the
    headline quotes the pooled figure with its method and the per-run spread, never the best
    single run."""
    top = _largest_size(sp)
    if top is None:
        return None
    if "run_id" in top and top["run_id"].nunique() > 1:
        pooled = _pooled_headline(c, top)
        if pooled:
            return pooled
    best = top.loc[top["speedup"].astype(float).idxmax()]
    where = f"N = {tables.seq_label(best)}, {best['dtype']} {best['mode']}"
    ok = sp[sp["speedup"].notna()]
    if "run_id" in ok and ok["run_id"].nunique() > 1:  # not poolable: say which run
        where += f", run {best['run_id']}"
    iv = ratio_text(_interval(best))
    sig = "" if best["significant"] else \
        f", not significant {str(best['significance']).removeprefix('no ')}"
    return _headline_text(c, best["backend"], iv, best["speedup"] >= 1, where, sig)


def _largest_size(sp: pd.DataFrame) -> pd.DataFrame | None:
    """The speedup rows with a ratio at the largest size that has one; None when none."""
    if sp.empty or "speedup" not in sp or sp["speedup"].isna().all():
        return None
    ok = sp[sp["speedup"].notna()]
    return ok[ok["seq_q"] == ok["seq_q"].max()]


def _headline_text(c: Comparison, backend: str, iv: str, faster: bool, where: str,
                   sig: str) -> str:
    if faster:
        return f"{c.name}: {backend} {iv} faster than {c.baseline} at {where}{sig}"
    return (f"{c.name}: {c.baseline} fastest at {where}; best of the rest {backend} "
            f"{iv}{sig}")


def _pooled_best(top: pd.DataFrame):
    """(pooled ratio, backend, first record) of the case and backend whose ratio pooled over
    the runs that measured it is largest; None when no case was measured in two or more."""
    best = None
    for _, g in top.groupby([c for c in ("key", "backend") if c in top], sort=False):
        if g["run_id"].nunique() < 2:
            continue
        p = pooling.random_effects([_within(r) for _, r in g.iterrows()])
        if p is not None and (best is None or p.interval.estimate > best[0].interval.estimate):
            best = (p, g.iloc[0]["backend"], g.iloc[0])
    return best


def headline_pick(sp: pd.DataFrame) -> tuple[str, float, bool, pd.Series] | None:
    """What a short headline names at the largest size with a ratio: (backend, factor,
    significant, a record of the case). Over several runs the factor is pooled, never the
    best single run's; None without ratios."""
    top = _largest_size(sp)
    if top is None:
        return None
    if "run_id" in top and top["run_id"].nunique() > 1:
        pooled = _pooled_best(top)
        if pooled:
            p, backend, first = pooled
            return backend, p.interval.estimate, significance.differs(p.interval), first
    best = top.loc[top["speedup"].astype(float).idxmax()]
    significant = bool(best["significant"]) if "significant" in best else True
    return best["backend"], float(best["speedup"]), significant, best


def _pooled_headline(c: Comparison, top: pd.DataFrame) -> str | None:
    """The headline from each (case, backend)'s ratio pooled over the runs that measured
    it; None when no case was measured in two or more runs."""
    best = _pooled_best(top)
    if best is None:
        return None
    p, backend, first = best
    where = f"N = {tables.seq_label(first)}, {first['dtype']} {first['mode']}"
    spread = f"per run {p.runs_low:.3g}-{p.runs_high:.3g}x"
    iv = ratios.format_ratio(p.interval)
    sig = "" if significance.differs(p.interval) else ", not significant (interval holds 1)"
    return _headline_text(c, backend, iv, p.interval.estimate >= 1, where,
                          f", {p.method_text()}, {spread}{sig}")


def coverage_headline(df: pd.DataFrame) -> str | None:
    """How many ok records' time intervals cover less than 95% (too few samples)."""
    if "time_ci_confidence" not in df.columns:
        return None
    ok = df[(df["status"] == "ok") & df["time_ci_confidence"].notna()]
    short = ok[ok["time_ci_confidence"].astype(float).map(short_of_level)]
    if short.empty:
        return None
    low = float(short["time_ci_confidence"].min())
    return (f"coverage: {len(short)} of {len(ok)} ok records have fewer than "
            f"{significance.MIN_SAMPLES} samples, so "
            f"their intervals cover less than 95% (down to {low:.0%}); each says its "
            f"coverage and none is called significant")


# ---- the noise flag ----------------------------------------------------------------------


def noise_rechecked(df: pd.DataFrame, timing: dict[str, dict]) -> pd.DataFrame:
    """``df`` with each ok record's noise flag decided again by the current rule
    (``stats.noise``) from its samples and probe readings, with each run's thresholds
    (``timing``: run label -> its meta's timing table), and ``noisy_why`` the reasons with
    their figures, and ``unsteadiness`` (``noise.unsteadiness``: what its across-runs
    intervals add): a record written under an older rule carries that rule's flag, and the
    report reads every run by one rule. Records without samples keep their flag."""
    if df.empty or "samples_ms" not in df.columns:
        return df
    df = df.copy()
    if "noisy" not in df.columns:
        df["noisy"] = False
    df["noisy"] = df["noisy"].astype(object)
    for col in ("noisy_by", "noisy_why"):
        if col not in df.columns:
            df[col] = None
        df[col] = df[col].astype(object)
    df["unsteadiness"] = 0.0
    default = TimingBudget()
    for i, r in df.iterrows():
        if r.get("status") != "ok" or not ratios.samples(r.get("samples_ms")):
            continue
        t = timing.get(str(r.get("run_id"))) or {}
        found = noise.record_flags(dict(r), float(t.get("unsteady_rel", default.unsteady_rel)),
                                   float(t.get("noise_threshold", default.noise_threshold)))
        df.at[i, "noisy"] = bool(found)
        df.at[i, "noisy_by"] = "+".join(f.check for f in found) if found else None
        df.at[i, "noisy_why"] = "; ".join(f.text() for f in found) if found else None
        df.at[i, "unsteadiness"] = noise.unsteadiness(found)
    return df


def noisy_records(df: pd.DataFrame, lines: list[str]) -> pd.DataFrame:
    """One row per ok record flagged noisy: its line, size, and each check that flagged it
    with what it measured against the limit it passed."""
    if "noisy" not in df.columns:
        return pd.DataFrame()
    flagged = df[(df["status"] == "ok") & df["noisy"].astype(object).eq(True)]
    names = [c for c in lines if c in flagged.columns]
    rows = []
    for _, r in flagged.iterrows():
        why = r.get("noisy_why")
        if not isinstance(why, str) or not why:
            by = r.get("noisy_by")
            why = f"{by if isinstance(by, str) and by else 'probe'} (recorded; no samples " \
                  "to say by how much)"
        rows.append({c: r[c] for c in names} | {"N": tables.seq_label(r), "reason": why})
    return pd.DataFrame(rows)


def unsteady_headline(df: pd.DataFrame) -> str | None:
    """When records were flagged noisy: how many, by the probe and by their own samples."""
    if "noisy" not in df.columns:
        return None
    ok = df[df["status"] == "ok"]
    noisy = ok[ok["noisy"].astype(object).eq(True)]
    if noisy.empty:
        return None
    by = noisy["noisy_by"].fillna("probe").astype(str) if "noisy_by" in noisy \
        else pd.Series(["probe"] * len(noisy))
    parts = [f"{int(by.str.contains(s).sum())} by {what}" for s, what in
             (("probe", "the drift probe moving within their group"),
              ("spread", "a spread over twice the probe's"),
              ("samples", "their own interval's width"))
             if by.str.contains(s).any()]
    runs = sorted(set(noisy["run_id"])) if "run_id" in noisy else []
    where = f" (runs: {', '.join(map(str, runs))})" if len(runs) > 1 else ""
    return (f"unsteady: {len(noisy)} of {len(ok)} ok records flagged noisy{where}: "
            f"{'; '.join(parts)}; marked ~ in the tables, each with its reason in the "
            f"appendix")


def claim_verdicts(df: pd.DataFrame, claims: list[dict]) -> str | None:
    """'goals: 2 holds, 1 inconclusive' over a run's claims."""
    if not claims:
        return None
    counts = Counter(claims_table(df, claims)["verdict"])
    return "goals: " + ", ".join(f"{n} {v}" for v, n in counts.most_common())
