"""``attnbench compare``: two runs joined on (key, backend), changes judged, a gate."""

from __future__ import annotations

from attnbench.core.errors import BadInput


def add_parser(sub) -> None:
    c = sub.add_parser("compare", help="join two runs on (key, backend) and flag regressions")
    c.add_argument("base", help="base run directory (or a merged dataset)")
    c.add_argument("new", nargs="?",
                   help="new run directory (left out: BASE is a dataset of two runs)")
    c.add_argument("--runs", metavar="BASE_ID,NEW_ID",
                   help="the two runs to compare, by id, when a folder is a merged dataset")
    c.add_argument("--metric", default="time_ms_median")
    c.add_argument("--threshold", type=float, default=0.10,
                   help="relative change that counts as a regression (default 0.10)")
    c.add_argument("--fail-on-regression", action="store_true",
                   help="exit 1 on a regression or a base pair missing from the new run")
    c.add_argument("--allow-missing", action="store_true",
                   help="pairs missing from the new run do not fail the gate")
    c.set_defaults(func=run)


def run(args) -> int:
    import pandas as pd

    from attnbench.analysis.run_diff import (
        decide,
        environment_difference,
        join_runs,
        regressions,
    )
    from attnbench.core import metrics
    from attnbench.runs.merge import compare_sides

    try:
        metric = metrics.get(args.metric)
    except KeyError:
        raise BadInput(f"--metric {args.metric}: not a declared metric; allowed: "
                       f"{', '.join(metrics.NAMES)}") from None
    if metric.better == metrics.NEUTRAL:
        raise BadInput(f"--metric {args.metric}: a count with no better direction; allowed: "
                       f"{', '.join(m.name for m in metrics.METRICS if m.better != 'neutral')}")
    if not args.threshold >= 0:
        raise BadInput(f"--threshold {args.threshold}: allowed: a relative change >= 0, "
                       f"e.g. 0.1")
    (base_meta, base), (new_meta, new) = compare_sides(args.base, args.new, args.runs)
    for name, df in (("base", base), ("new", new)):
        if args.metric not in df.columns:
            raise BadInput(f"--metric {args.metric}: no record of the {name} run has it")
    diff = environment_difference(base_meta, new_meta)
    if diff:
        print("environment differs: " + "; ".join(diff) + "\n")
    decided = decide(join_runs(base, new, args.metric), args.metric, args.threshold)
    shown = decided.dropna(subset=["ratio"]).sort_values("ratio", ascending=False)
    cols = ["backend", "key", f"{args.metric}_base", f"{args.metric}_new", "ratio",
            "ratio_low", "ratio_high", "p_value", "change", "code_changed"]
    print(shown[cols].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    bad = regressions(decided)
    only_base = decided[decided["status_new"].isna()]
    only_new = decided[decided["status_base"].isna()]
    print(f"\n{len(decided)} joined records, {len(shown)} with the metric in both runs, "
          f"{len(bad)} regression(s) ({metric.better} is better; significant at p < 0.05 "
          f"and beyond {args.threshold:.0%})")
    if len(only_base) or len(only_new):
        print(f"missing: {len(only_base)} pair(s) of the base run not in the new one, "
              f"{len(only_new)} of the new run not in the base"
              + ("" if args.allow_missing else " (they fail --fail-on-regression; "
                 "--allow-missing to accept)"))
        for _, r in only_base.head(20).iterrows():
            print(f"  MISSING {r['backend']} {r['key']}")
    if len(decided) - len(only_base) - len(only_new) == 0:
        print("nothing was compared: the runs share no (key, backend) pair")
        return 1 if args.fail_on_regression else 0
    if not args.allow_missing and len(only_base):
        bad = pd.concat([bad, only_base])
    for _, r in bad.iterrows():
        code = " (backend code changed)" if r["code_changed"] else ""
        print(f"  REGRESSION {r['backend']} {r['key']}: {r['status_base']} -> "
              f"{r['status_new']}, ratio {r['ratio']:.3g}{code}")
    return 1 if (args.fail_on_regression and not bad.empty) else 0
