"""``attnbench recommend``: the fastest exact backend within tolerance for a shape."""

from __future__ import annotations


def add_parser(sub) -> None:
    rec = sub.add_parser("recommend", help="the fastest exact backend within tolerance on "
                                           "the measured problem nearest to a shape")
    rec.add_argument("--shape", required=True,
                     help='e.g. "b=1,hq=32,hkv=8,n=8192,d=128,dtype=bfloat16,mask=causal" '
                          "(keys: b hq hkv n nq nk d dv dtype mask mode device)")
    rec.add_argument("runs", nargs="*", help="run directories or folders of runs "
                                             "(default: results)")
    rec.set_defaults(func=run)


def run(args) -> int:
    import pandas as pd

    from attnbench.analysis.recommend import parse_shape, recommend, render
    from attnbench.runs.record_files import load_results

    shape = parse_shape(args.shape)
    runs = args.runs or ["results"]
    frames = [load_results(r) for r in runs]
    print(render(recommend(shape, pd.concat(frames, ignore_index=True)), ", ".join(runs)),
          end="")
    return 0
