"""Mask geometry (core/masks.py): a window bound past the sequences is cut to their reach."""

import torch

from attnbench.core.case import Case
from attnbench.core.masks import INT64_MAX, MaskSpec, allowed_rows


def test_window_past_the_sequence_is_cut_to_its_reach():
    wide = Case(seq_q=64, seq_k=64, mask="window(100000,0)")
    assert wide.mask == "window(100000,0)"  # the key says what the suite said
    assert (wide.mask_spec.left, wide.mask_spec.right) == (63, 0)
    causal = Case(seq_q=64, seq_k=64, mask="causal")
    assert wide.visible_pairs == causal.visible_pairs == 64 * 65 // 2
    assert torch.equal(allowed_rows(wide.mask_spec, 0, 64, 64, 64),
                       allowed_rows(causal.mask_spec, 0, 64, 64, 64))
    # the largest bound int64 holds: geometry on the reach, no overflow anywhere
    top = Case(seq_q=48, seq_k=80, mask=f"window({INT64_MAX},{INT64_MAX})")
    assert (top.mask_spec.left, top.mask_spec.right) == (79, 47)
    assert top.visible_pairs == 48 * 80
    # a bound exactly at the reach is kept as written
    at = MaskSpec.parse("window(79,47)").clamped(48, 80)
    assert (at.left, at.right) == (79, 47)
