"""naive: textbook attention that materializes the (Nq, Nk) scores and probabilities.

Memory is O(B * H * Nq * Nk): the baseline every memory-efficient kernel is judged against.
"""

from __future__ import annotations

import torch

from attnbench.core.backend import Backend, Capabilities
from attnbench.core.heads import repeat_kv
from attnbench.core.masks import allowed_rows
from attnbench.implementations import _paged
from attnbench.implementations._varlen import document_allowed


class Naive(Backend):
    name = "naive"
    description = "softmax(Q K^T * scale) V with the full score matrix; GQA by repeating K/V"
    caps = Capabilities(masks=("none", "causal", "window", "block_sparse"), any_mask=True,
                        lengths=True, paged=True)

    def build(self, case, inputs):
        if case.page_size:
            return paged_naive(case, inputs)
        if case.lengths:  # a packed batch: the block-diagonal (document) mask, (B, 1, N, N)
            allowed = document_allowed(case, inputs.q.device)
        else:
            allowed = allowed_rows(case.mask_spec, 0, case.seq_q, case.seq_q, case.seq_k,
                                   inputs.q.device, case.block_layout,
                                   case.param("block_size"))  # (Nq, Nk)
        blocked = None if allowed is None else ~allowed
        empty_rows = None
        if allowed is not None and not bool(allowed.any(dim=-1).all()):
            empty_rows = ~allowed.any(dim=-1, keepdim=True)  # (Nq, 1): rows that see nothing
        scale, group = case.softmax_scale, case.group_size

        def naive(q, k, v):
            k, v = repeat_kv(k, group), repeat_kv(v, group)  # (B, Hq, Nk, D|Dv)
            s = torch.matmul(q * scale, k.transpose(-1, -2))  # (B, Hq, Nq, Nk)
            if blocked is not None:
                s.masked_fill_(blocked, float("-inf"))
            p = torch.softmax(s, dim=-1)
            if empty_rows is not None:
                p = p.masked_fill(empty_rows, 0.0)  # softmax of all -inf is NaN; define it as 0
            return torch.matmul(p, v)  # (B, Hq, Nq, Dv)

        return naive


def paged_naive(case, inputs):
    """A paged decode step: gather each sequence's pages by the block table, then textbook
    attention with its context's mask. The pool is built at setup; k, v are not read."""
    pc = _paged.setup(case, inputs)
    Np = pc.block_table.shape[1] * case.page_size
    blocked = ~_paged.context_allowed(pc.context, case.seq_q, Np,
                                      case.mask == "causal")  # (B, 1, Nq, Np)
    scale, group = case.softmax_scale, case.group_size

    gather_k = _paged.gatherer(pc.k_pool, pc.block_table)
    gather_v = _paged.gatherer(pc.v_pool, pc.block_table)

    def naive_paged(q, k, v):
        k = repeat_kv(gather_k(), group)  # (B, Hq, Np, D)
        v = repeat_kv(gather_v(), group)  # (B, Hq, Np, Dv)
        s = torch.matmul(q * scale, k.transpose(-1, -2))  # (B, Hq, Nq, Np)
        s.masked_fill_(blocked, float("-inf"))
        return torch.matmul(torch.softmax(s, dim=-1), v)  # (B, Hq, Nq, Dv)

    return naive_paged


BACKENDS = [Naive()]
