"""Report tables (reporting/tables.py): a row per knob value, no record dropped, moving columns."""

from __future__ import annotations

import pandas as pd

from attnbench.core import metrics
from attnbench.core.case import Case
from attnbench.measure.execute import CaseCache, execute
from attnbench.measure.timing import TimingBudget
from attnbench.reporting import tables


def _linear_knob_records():
    budget = TimingBudget(warmup_s=0.0, budget_s=0.01, min_reps=2, max_reps=3)
    cache = CaseCache()
    rows = []
    for fmap in ("elu", "favor"):
        for n in (32, 64):
            case = Case(batch=1, heads_q=2, heads_kv=2, seq_q=n, seq_k=n, head_dim=16,
                        head_dim_v=16, feature_map=fmap, num_features=32)
            rows.append(execute(case, "linear", budget, cache).to_row() | {"run_id": "r"})
    return pd.DataFrame(rows)


def test_knob_sweep_gets_a_row_per_knob_value_in_every_table(tmp_path):
    df = _linear_knob_records()
    assert (df["status"] == "ok").all(), df[["status", "reason"]]
    assert "feature_map" in tables.line_columns(df)
    for m in metrics.tabulated():
        if m.name in df.columns and df[m.name].notna().any():
            table = tables.pivot(df, m.name)
            assert len(table) == 2, (m.name, table)
            assert set(table.index.get_level_values("feature_map")) == {"elu", "favor"}
    # the plot draws one line per knob value too
    from attnbench.reporting.plots import time_chart

    drawn = []
    import matplotlib.axes

    original = matplotlib.axes.Axes.errorbar

    def spy(self, *args, label=None, **kwargs):
        drawn.append(label)
        return original(self, *args, label=label, **kwargs)

    matplotlib.axes.Axes.errorbar = spy
    try:
        assert time_chart(df, "t", tmp_path / "p.png", tables.line_columns(df))
    finally:
        matplotlib.axes.Axes.errorbar = original
    assert sorted(drawn) == ["feature_map=elu linear", "feature_map=favor linear"]


def test_pivot_never_drops_a_record():
    row = {"run_id": "r", "key": "k", "backend": "b", "status": "ok", "seq_q": 8, "seq_k": 8,
           "dtype": "float32", "mask": "none", "mode": "fwd", "time_ms_median": 1.0}
    df = pd.DataFrame([row, row | {"time_ms_median": 9.0}])
    cell = tables.pivot(df).iloc[0, 0]
    assert "1" in cell and "9" in cell


def test_a_column_the_lengths_determine_moves_along_the_line():
    """h200's batch = 16384 // N: one line per (backend, head_dim), not a diagonal table;
    a batch swept at each N still gets a line per value."""
    import pandas as pd

    from attnbench.reporting.tables import line_columns, moving_caption

    rows = [dict(backend=b, dtype="bfloat16", mask="causal", mode="fwd", seq_q=n, seq_k=n,
                 batch=16384 // n, head_dim=d, heads_q=2048 // d)
            for b in ("triton_flash", "sdpa_flash") for d in (64, 128) for n in (1024, 4096)]
    derived = line_columns(pd.DataFrame(rows))
    assert "batch" not in derived and {"head_dim", "heads_q"} <= set(derived)
    # the rows cannot say it, so the caption does
    assert moving_caption(pd.DataFrame(rows)) == \
        "Moving with N, not a row of its own: batch (1024: 16, 4096: 4)."
    swept = pd.DataFrame([r | {"batch": b} for r in rows for b in (1, 4)])
    assert "batch" in line_columns(swept) and moving_caption(swept) == ""
    # two runs that measured different lengths stay two lines
    runs = pd.DataFrame([r | {"run_id": "h100" if r["seq_q"] == 1024 else "h200"}
                         for r in rows])
    assert "run_id" in line_columns(runs)


def _param_row(backend, n, **values):
    return {"run_id": "r", "key": f"k{n}", "backend": backend, "status": "ok", "seq_q": n,
            "seq_k": n, "dtype": "float32", "mask": "none", "mode": "fwd",
            "time_ms_median": float(n), "block_band": 1, "feature_map": "elu",
            "additive_dim": 0} | values


def test_a_parameter_cell_is_blank_on_backends_that_do_not_read_it():
    df = pd.DataFrame([_param_row("sdpa", 64), _param_row("linear", 64),
                       _param_row("linear", 64, feature_map="favor"),
                       _param_row("block_sparse", 64, block_band=2)])
    table = tables.pivot(df)
    rows = {idx[table.index.names.index("backend")]: dict(zip(table.index.names, idx))
            for idx in table.index if idx[table.index.names.index("feature_map")] != "favor"}
    assert rows["sdpa"]["block_band"] == "" and rows["sdpa"]["feature_map"] == ""
    assert rows["block_sparse"]["block_band"] == 2 and rows["block_sparse"]["feature_map"] == ""
    assert rows["linear"]["feature_map"] == "elu" and rows["linear"]["block_band"] == ""
    assert len(table) == 4  # every record keeps its own row


def test_a_parameter_stays_where_blanking_would_merge_two_records():
    # sdpa timed on the same problem in two groups that differ by additive's parameter only
    df = pd.DataFrame([_param_row("sdpa", 64), _param_row("sdpa", 64, additive_dim=64),
                       _param_row("additive", 64, additive_dim=64)])
    table = tables.pivot(df)
    assert len(table) == 3
    assert sorted(str(i[table.index.names.index("additive_dim")]) for i in table.index) == \
        ["0", "64", "64"]
    assert all("|" not in cell for cell in table.iloc[:, 0])
