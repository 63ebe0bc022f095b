"""Measured properties of a case's inputs, the ones that explain an approximation's error:
how peaked the attention is, how much of it sinks onto one key, how many dimensions the keys
use, and how heavy-tailed the channels are. Computed in float64 on the full (unmasked)
softmax attention ``softmax(scale q k^T)``, over at most ``MAX_ROWS`` evenly spaced query
rows per head (fewer at long N: at most ``MAX_SCORES`` scores in all) so it stays cheap.

``python -m attnbench.core.inputs_properties`` prints them for every kind of inputs, the
captured layers beside the synthetic distributions that imitate them.
"""

from __future__ import annotations

import math

import torch

MAX_ROWS = 256
MAX_SCORES = 4 * 2**20
TOP_K = 8


def _attention(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """Probabilities (B, Hq, rows, Nk) in float64, GQA keys repeated to the query heads."""
    B, Hq, Nq, D = q.shape
    n_rows = max(8, min(MAX_ROWS, MAX_SCORES // (B * Hq * k.shape[2])))
    rows = torch.linspace(0, Nq - 1, min(Nq, n_rows)).round().long().unique()
    qd = q[:, :, rows].double()  # (B, Hq, rows, D)
    kd = k.double().repeat_interleave(Hq // k.shape[1], dim=1)  # (B, Hq, Nk, D)
    return torch.softmax(scale * qd @ kd.transpose(-1, -2), dim=-1)


def effective_rank(x: torch.Tensor) -> float:
    """Roy and Vetterli's effective rank of each (N, D) head matrix, averaged: exp of the
    entropy of its normalised singular values (D for isotropic noise, r for rank r)."""
    s = torch.linalg.svdvals(x.double().flatten(0, 1))  # (B*H, min(N, D))
    p = s / s.sum(-1, keepdim=True)
    ent = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)
    return float(torch.exp(ent).mean())


def kurtosis(x: torch.Tensor) -> float:
    """Kurtosis of all entries pooled over tokens and channels (3 for a normal distribution;
    a few channels far larger than the rest raise it)."""
    v = x.double().flatten()
    c = v - v.mean()
    return float((c**4).mean() / (c**2).mean() ** 2)


def properties(q: torch.Tensor, k: torch.Tensor, scale: float) -> dict[str, float]:
    """The ``in_*`` columns of a record (declared in ``core/metrics.py``)."""
    p = _attention(q, k, scale)  # (B, Hq, rows, Nk)
    nk = p.shape[-1]
    ent = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)  # (B, Hq, rows)
    top = p.topk(min(TOP_K, nk), dim=-1).values.sum(-1)
    sink = p.mean(2).amax(-1)  # (B, Hq): mass on the key that receives most, per head
    return {
        "in_entropy": float(ent.mean() / math.log(nk)) if nk > 1 else 0.0,
        "in_top8_mass": float(top.mean()),
        "in_sink_mass": float(sink.mean()),
        "in_eff_rank_k": effective_rank(k),
        "in_kurtosis_qk": max(kurtosis(q), kurtosis(k)),
    }


def _print_table(seq_len: int = 256) -> None:
    from attnbench.core import inputs_captured
    from attnbench.core.case import Case

    specs = ["randn", "peaked", "sinks", "lowrank", "outliers"]
    if inputs_captured.unavailable_reason() is None:
        specs = [f"minilm({layer})" for layer in (0, 3, 5)] + specs
    else:
        print(f"# captured inputs skipped: {inputs_captured.unavailable_reason()}")
    names = list(properties(torch.zeros(1, 1, 2, 2), torch.ones(1, 1, 2, 2), 1.0))
    print("| inputs | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for spec in specs:
        case = Case(batch=2, heads_q=12, heads_kv=12, seq_q=seq_len, seq_k=seq_len,
                    head_dim=32, head_dim_v=32, inputs=spec)
        x = case.make_inputs()
        props = properties(x.q, x.k, case.softmax_scale)
        print(f"| {spec} | " + " | ".join(f"{props[n]:.3g}" for n in names) + " |")


if __name__ == "__main__":
    _print_table()
