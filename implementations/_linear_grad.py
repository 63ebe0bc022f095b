"""linear's explicit backward for the non-causal form, one K/V head at a time.

Forward (per query head): S = phi(K)^T V (F, Dv), z = phi(K)^T 1 (F,), O = phi(Q) S / (phi(Q) z).
With dnum = dO / den and dden = -rowsum(dnum * O) (as O = num / den):

    dphi(Q) = dnum S^T + dden z^T        dS = sum over the G query heads of phi(Q)^T dnum
    dphi(K) = V dS^T + 1 dz^T            dz = sum over the G query heads of phi(Q)^T dden
    dV      = phi(K) dS

and dQ, dK through the feature map (``phi_grad_into``). Autograd on the same formula keeps
every intermediate of every elementwise op and ran at a sixth of the machine's matmul rate
(elu, N = 4096, fwd_bwd); here phi is recomputed in reused per-thread buffers and the work
is six N x F x Dv matmuls, as in a fused kernel.
"""

from __future__ import annotations

import torch

from attnbench.implementations._cpu_threads import split_work
from attnbench.implementations._linear_features import phi_grad_into, phi_head


def global_backward(qc, kc, vc, out, dout, states, G, proj_s, half_scale):
    """dq, dk, dv of the non-causal form. qc (B, Hq, Nq, D), kc (B, Hkv, Nk, D), vc (B, Hkv,
    Nk, Dv), out and dout (B, Hq, Nq, Dv), all in one dtype; ``states[h]`` = (S, z) of K/V
    head h as the forward computed them (``_global_stream``)."""
    B, Hq, Nq, D = qc.shape
    Hkv, Nk, Dv = kc.shape[1], kc.shape[2], vc.shape[-1]
    Fd = D if proj_s is None else proj_s.shape[0]
    q3, do3, o3 = (t.reshape(B * Hq, Nq, -1) for t in (qc, dout, out))
    k3, v3 = kc.reshape(B * Hkv, Nk, D), vc.reshape(B * Hkv, Nk, Dv)
    dq, dk, dv = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(v3)
    tiny = torch.finfo(qc.dtype).tiny
    rows = max(Nq, Nk)

    def work(h0: int, h1: int) -> None:  # K/V heads [h0, h1) and their query heads
        f, t = qc.new_empty(rows, Fd), qc.new_empty(rows, Fd)  # phi, scratch / dphi
        dnum = qc.new_empty(Nq, Dv)
        for h in range(h0, h1):
            s, z = states[h]  # (F, Dv), (F,)
            ds, dz = torch.zeros_like(s), torch.zeros_like(z)
            for i in range(h * G, (h + 1) * G):
                fq = phi_head(q3[i], proj_s, half_scale, f[:Nq], t[:Nq], keys=False)  # (Nq, F)
                den = torch.mv(fq, z).clamp_(min=tiny)  # (Nq,) as the forward divided
                torch.div(do3[i], den.unsqueeze(1), out=dnum)  # (Nq, Dv)
                dden = (dnum * o3[i]).sum(dim=-1).neg_()  # (Nq,)
                ds.addmm_(fq.T, dnum)
                dz.addmv_(fq.T, dden)
                dfq = torch.mm(dnum, s.T, out=t[:Nq]).addr_(dden, z)  # (Nq, F)
                phi_grad_into(q3[i], fq, dfq, proj_s, half_scale, dq[i], keys=False)
            fk = phi_head(k3[h], proj_s, half_scale, f[:Nk], t[:Nk], keys=True)  # (Nk, F)
            torch.mm(fk, ds, out=dv[h])  # (Nk, Dv)
            dfk = torch.mm(v3[h], ds.T, out=t[:Nk]).add_(dz)  # (Nk, F)
            phi_grad_into(k3[h], fk, dfk, proj_s, half_scale, dk[h], keys=True)

    split_work(work, B * Hkv, qc.device)
    return dq.view(qc.shape), dk.view(kc.shape), dv.view(vc.shape)
