"""Record tables written by hand: the columns a comparison, a line name or a chart reads."""

from __future__ import annotations


def records_frame(rows):
    import pandas as pd
    base = {"run_id": "r", "status": "ok", "dtype": "float32", "mode": "fwd", "seq_k": 1024,
            "feature_map": "elu", "block_random": 2, "additive_dim": 0}
    return pd.DataFrame([base | r | {"seq_k": r["seq_q"]} for r in rows])
