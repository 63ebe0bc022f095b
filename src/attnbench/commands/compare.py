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
                   help="exit 1 on a regression (worse, or ok -> not ok) or a base pair "
                        "missing from the new run")
    c.add_argument("--fail-on-cannot-tell", action="store_true",
                   help="exit 1 also when a pair's change cannot be told (too few samples or "
                        "too wide an interval to say worse, better or unchanged)")
    c.add_argument("--allow-missing", action="store_true",
                   help="pairs missing from the new run do not fail the gate")
    c.add_argument("--absolute", action="store_true",
                   help="judge raw ratios new / base, not over partners or the machine's move")
    c.set_defaults(func=run)


def run(args) -> int:
    import math

    import pandas as pd

    from attnbench.analysis import run_diff
    from attnbench.core import metrics
    from attnbench.runs.merge import compare_sides
    from attnbench.runs.record_files import no_records_yet
    from attnbench.stats import probe_shift

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
    for where, meta, side in ((args.base, base_meta, base), (args.new or args.base, new_meta,
                                                              new)):
        if side.empty:
            raise BadInput(no_records_yet(where, meta))
    if args.metric not in base.columns and args.metric not in new.columns:
        raise BadInput(f"--metric {args.metric}: no record of either run has it")
    diff = run_diff.environment_difference(base_meta, new_meta)
    if diff:
        print("environment differs: " + "; ".join(diff) + "\n")
    for line in run_diff.device_state_difference(base_meta, new_meta, base, new):
        print(f"device state: {line}\n")
    judged = run_diff.judge(base, new, args.metric, args.threshold,
                            run_diff.same_setup(base_meta, new_meta), args.absolute)
    decided, move = judged.decided, judged.move
    shown = decided.dropna(subset=["ratio"]).sort_values("ratio", ascending=False)
    paired = int(decided["vs_partners"].notna().sum())
    cols = ["backend", "key", f"{args.metric}_base", f"{args.metric}_new", "ratio",
            "ratio_low", "ratio_high", *(["vs_machine"] if move else []),
            *(["vs_partners"] if paired else []), "change", "code_changed"]
    if not shown.empty:
        print(shown[cols].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    print()
    _machine(move, base_meta, new_meta, args)
    bad = run_diff.regressions(decided)
    counts = run_diff.change_counts(decided)
    device = run_diff.run_device(new)
    print("ratio_low/high: intervals across runs (within-run widened by the between-run "
          "allowance); records timed under an interpreter are no speed: cannot tell")
    if paired:
        print(f"vs_partners: {paired} records judged by their change over their unchanged "
              f"partners timed in the same rounds (the machine's move in those rounds "
              f"divides out), across runs +-{math.expm1(judged.partners_between):.0%}; the "
              f"others by {'vs_machine' if move else 'their raw ratio'}")
    elif judged.not_partners:
        print(f"vs_partners: {judged.not_partners}; every record is judged by "
              f"{'vs_machine' if move else 'its raw ratio'}")
    moved = decided[decided["probe_shift"].notna()]
    limit = (f"beyond the {probe_shift.limit(device):.3g}x two runs of one machine state "
             f"show")
    refused, carried = moved[moved["vs_partners"].isna()], moved[moved["vs_partners"].notna()]
    if not refused.empty:
        print(f"probe_shift: {len(refused)} records cannot tell: the drift probe in their "
              f"rounds moved between the runs by {_span(refused)} over the run's move, "
              f"{limit}, so the machine under them differed and a change of theirs cannot "
              f"be told from it")
    if not carried.empty:
        print(f"probe_shift: {len(carried)} records judged over their partners, whose "
              f"rounds' drift probe moved between the runs by {_span(carried)}, {limit}: "
              f"their intervals carry that move as a known departure (a burst slows a "
              f"record and its partners unevenly)")
    unclear = decided[decided["change"] == "cannot tell"]
    only_base = decided[decided["status_new"].isna()]
    only_new = decided[decided["status_base"].isna()]
    print(f"{len(decided)} joined records, {len(shown)} with the metric in both runs: "
          + ", ".join(f"{n} {c}" for c, n in counts.items())
          + f" ({metric.better} is better; a change needs its interval, "
            f"{run_diff.significance.family_text(judged.judged, judged.level)}, with the "
            f"{run_diff.between_text(move.between if move else None, device)}, to exclude 1 "
            f"and "
            f"its estimate beyond {args.threshold:.0%}, from at least "
            f"{run_diff.significance.MIN_SAMPLES} samples a side; unchanged needs the "
            f"interval within {args.threshold:.0%})")
    why = run_diff.why_counts(decided)
    if why:
        print("cannot tell, why: " + "; ".join(f"{n} {run_diff.WHY.get(k, k)}"
                                                for k, n in why.items()))
    print(f"{len(bad)} regression(s)")
    if len(only_base) or len(only_new):
        print(f"missing: {len(only_base)} pair(s) of the base run not in the new one, "
              f"{len(only_new)} of the new run not in the base"
              + ("" if args.allow_missing else " (they fail --fail-on-regression; "
                 "--allow-missing to accept)"))
        for _, r in only_base.head(20).iterrows():
            print(f"  MISSING {r['backend']} {r['key']} (base: {r['status_base']})")
        if len(only_base) > 20:
            print(f"  ... and {len(only_base) - 20} more missing")
    if len(decided) - len(only_base) - len(only_new) == 0:
        print("nothing was compared: the runs share no (key, backend) pair")
        return 1 if args.fail_on_regression or args.fail_on_cannot_tell else 0
    if not args.allow_missing and len(only_base):
        bad = pd.concat([bad, only_base])
    for _, r in bad[bad["status_new"].notna()].iterrows():  # (missing ones listed above)
        code = " (backend code changed)" if r["code_changed"] else ""
        print(f"  REGRESSION {r['backend']} {r['key']}: {r['status_base']} -> "
              f"{r['status_new']}{run_diff.ratio_text(r)}{code}")
    if args.fail_on_cannot_tell:
        for _, r in unclear.iterrows():
            print(f"  CANNOT TELL {r['backend']} {r['key']}{run_diff.ratio_text(r)} "
                  f"[{r['ratio_low']:.3g}, {r['ratio_high']:.3g}]")
    failed = (args.fail_on_regression or args.fail_on_cannot_tell) and not bad.empty
    return 1 if failed or (args.fail_on_cannot_tell and not unclear.empty) else 0


def _machine(move, base_meta: dict, new_meta: dict, args) -> None:
    """What the references say about the machine between the runs, and how it was used."""
    from attnbench.analysis import run_diff

    extra = run_diff.ceiling_move(base_meta, new_meta)
    probe = run_diff.probe_move(base_meta, new_meta)
    info = "; ".join(([probe] if probe else []) + (["matmul ceiling " + ", ".join(extra)]
                                                   if extra else []))
    if move is not None:
        print(f"machine: {move.describe()}; each record is judged by its ratio over that "
              f"move (vs_machine)" + (f". Also: {info}" if info else ""))
    elif args.absolute:
        print("machine: not separated (--absolute): raw ratios decide"
              + (f". For reference: {info}" if info else ""))
    else:
        print(f"machine: no reference to tell it from the code (fewer than "
              f"{run_diff.MIN_REFERENCES} records of unchanged backend code whose backends "
              f"mostly agree, and no drift probe in both runs), so a move of the machine "
              f"cannot be told from a change of the code; raw ratios decide"
              + (f". For reference: {info}" if info else ""))


def _span(rows) -> str:
    """'1.16-1.28x' (or '1.16x'): the range of the records' probe moves."""
    low, high = f"{rows['probe_shift'].min():.3g}", f"{rows['probe_shift'].max():.3g}"
    return f"{low}x" if low == high else f"{low}-{high}x"
