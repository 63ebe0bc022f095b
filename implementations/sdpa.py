"""sdpa: ``torch.nn.functional.scaled_dot_product_attention``, PyTorch choosing the kernel.

Causal with seq_q != seq_k uses ``causal_lower_right`` (bottom-right aligned, as in
DESIGN.md); windows and block layouts go in as an explicit boolean mask, which
restricts PyTorch to the kernels that accept a mask.
"""

from __future__ import annotations

import torch.nn.functional as F

from attnbench.backend import Backend, Capabilities
from attnbench.masks import allowed_rows


def sdpa_arguments(case, device) -> dict:
    """Keyword arguments for scaled_dot_product_attention expressing the case's mask."""
    spec = case.mask_spec
    kwargs: dict = {"scale": case.softmax_scale}
    if case.heads_q != case.heads_kv:
        kwargs["enable_gqa"] = True
    if spec.kind == "causal" and case.seq_q == case.seq_k:
        kwargs["is_causal"] = True
    elif spec.kind == "causal":
        from torch.nn.attention.bias import causal_lower_right

        kwargs["attn_mask"] = causal_lower_right(case.seq_q, case.seq_k)
    elif spec.kind != "none":
        kwargs["attn_mask"] = allowed_rows(spec, 0, case.seq_q, case.seq_q, case.seq_k, device,
                                           case.block_layout, case.block_size)  # (Nq, Nk)
    return kwargs


class Sdpa(Backend):
    name = "sdpa"
    description = "torch scaled_dot_product_attention, kernel chosen by PyTorch"
    caps = Capabilities(masks=("none", "causal", "window", "block_sparse"))

    def build(self, case, inputs):
        kwargs = sdpa_arguments(case, inputs.q.device)

        def sdpa(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, **kwargs)

        return sdpa


BACKENDS = [Sdpa()]
