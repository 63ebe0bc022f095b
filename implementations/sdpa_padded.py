"""sdpa_padded: a packed batch padded to its longest document, the waste baseline.

Every document is gathered into a (count, H, max, D) batch, padding past its end; torch's
``scaled_dot_product_attention`` runs on it with a key-padding mask (and the causal one), and
the real tokens' outputs are gathered back into the rows' (B, H, N, D) layout. The gathers
are part of the timed call, as a padded pipeline pays them. Its work counts only the
within-document pairs (the case's FLOPs), so its throughput shows the padding's waste beside
the packed backends (``sdpa`` over nested tensors, ``flex`` with a document mask).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnbench.core.backend import Backend, Capabilities, wrap_mode
from attnbench.implementations._varlen import flat_offsets, from_tokens_major, tokens_major
from attnbench.implementations.sdpa import detect_kernel


class SdpaPadded(Backend):
    name = "sdpa_padded"
    description = ("packed batch padded to its longest document: torch sdpa with a "
                   "key-padding (and causal) mask; the padding is work not counted")
    caps = Capabilities(masks=("none", "causal"), lengths=True, dense=False)

    def build(self, case, inputs):
        device = inputs.q.device
        offsets = flat_offsets(case).to(device)  # (count + 1,)
        docs = offsets.diff()  # (count,)
        count, longest = len(docs), int(docs.max())
        pos = torch.arange(longest, device=device)
        valid = pos[None, :] < docs[:, None]  # (count, L)
        gather = torch.where(valid, offsets[:-1, None] + pos[None, :], 0)  # (count, L)
        allowed = valid[:, None, None, :]  # (count, 1, 1, L): keys past a document's end
        if case.mask == "causal":
            allowed = allowed & torch.ones(longest, longest, dtype=torch.bool,
                                           device=device).tril()  # (count, 1, L, L)
        real = valid.flatten().nonzero().squeeze(1)  # (T,): real tokens in count * L order
        kwargs = {"attn_mask": allowed, "scale": case.softmax_scale}
        if case.heads_q != case.heads_kv:
            kwargs["enable_gqa"] = True

        def pad(t):  # (B, H, N, D) -> (count, H, L, D)
            return tokens_major(t)[gather].transpose(1, 2)

        def sdpa_padded(q, k, v):
            o = F.scaled_dot_product_attention(pad(q), pad(k), pad(v), **kwargs)
            o = o.transpose(1, 2).reshape(count * longest, o.shape[1], o.shape[-1])[real]
            return from_tokens_major(o, q.shape[0])  # (B, Hq, N, Dv)

        return sdpa_padded

    def prepare(self, case, inputs):
        f = self.build(case, inputs)
        prepared = wrap_mode(f, case, inputs)
        prepared.extras["kernel"] = detect_kernel(f, case, inputs)
        return prepared


BACKENDS = [SdpaPadded()]
