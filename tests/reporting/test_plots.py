"""Charts: status marks never read negative, one colour per backend and mask."""

from __future__ import annotations

import pytest
from record_frames import records_frame


@pytest.mark.parametrize("chart", ["time", "speedup"])
def test_charts_of_status_marks_only_never_read_negative(tmp_path, chart):
    import matplotlib.pyplot as plt

    from attnbench.reporting import plots
    df = records_frame([{"backend": "sliding_window", "key": f"k{n}", "mask": "causal",
                    "seq_q": n, "status": "unsupported"} for n in (1024, 2048)])
    seen = []
    original = plots._finish

    def keep_limits(fig, ax, path, title):
        seen.append(np.ravel(ax)[0].get_ylim())
        original(fig, ax, path, title)

    import numpy as np
    plots._finish = keep_limits
    try:
        if chart == "time":
            plots.time_chart(df, "t", tmp_path / "t.png", ["backend", "mask"])
        else:
            sp = df.assign(speedup=None, speedup_low=None, speedup_high=None,
                           significant=False, baseline_status="ok")
            plots.speedup_chart(sp, "s", tmp_path / "s.png", ["backend", "mask"], "sdpa")
    finally:
        plots._finish = original
        plt.close("all")
    assert seen and seen[0][0] >= 0, seen


def test_two_masks_of_one_backend_get_two_colours():
    from attnbench.reporting.plots import Palette
    p = Palette()
    window = p.of({"backend": "naive", "mask": "window(255,0)"})["color"]
    causal = p.of({"backend": "naive", "mask": "causal"})["color"]
    assert window != causal
    assert p.color("naive") == window
