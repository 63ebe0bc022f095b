"""Head-layout helpers shared by backends."""

from __future__ import annotations

import torch


def repeat_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    """(B, Hkv, N, D) -> (B, Hkv * group, N, D): each K/V head serves ``group`` query heads."""
    if group == 1:
        return x
    B, H, N, D = x.shape
    return x[:, :, None].expand(B, H, group, N, D).reshape(B, H * group, N, D)
