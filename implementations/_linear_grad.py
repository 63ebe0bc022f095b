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


def global_backward(qc, kc, vc, out, dout, states, G, proj_s, half_scale, buf=None):
    """dq, dk, dv of the non-causal form. qc (B, Hq, Nq, D), kc (B, Hkv, Nk, D), vc (B, Hkv,
    Nk, Dv), out and dout (B, Hq, Nq, Dv), all in one dtype; ``states[h]`` = (S, z) of K/V
    head h as the forward computed them (``_global_stream``, whose block size ``buf`` is
    not needed here: phi is recomputed a whole head at a time)."""
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


def causal_backward(qc, kc, vc, out, dout, states, G, proj_s, half_scale, C):
    """dq, dk, dv of the causal form computed by ``_causal_stream`` (seq_q == seq_k = N, a
    multiple of the chunk C): qc (B, Hq, N, D), kc (B, Hkv, N, D), vc (B, Hkv, N, Dv), out
    and dout (B, Hq, N, Dv); ``states[h]`` = (S, z), the inclusive prefix sums over chunks
    (nc, F, Dv) and (nc, F, 1) of K/V head h.

    Chunk c's output is (A_c V_c + phi(Q_c) S_<c) / den_c with A_c = tril(phi(Q_c)
    phi(K_c)^T) and den_c = A_c 1 + phi(Q_c) z_<c. Besides the non-causal terms, inside a
    chunk dA = tril(dnum V^T + dden 1^T); across chunks, the state of chunk c reaches every
    later chunk, so its gradient is the sum of the later chunks' dS_<c' (a reverse prefix
    sum) and flows to phi(K_c) and V_c.
    """
    B, Hq, N, D = qc.shape
    Hkv, Dv = kc.shape[1], vc.shape[-1]
    Fd = D if proj_s is None else proj_s.shape[0]
    nc = N // C
    q3, do3, o3 = (t.reshape(B * Hq, N, -1) for t in (qc, dout, out))
    k3, v3 = kc.reshape(B * Hkv, N, D), vc.reshape(B * Hkv, N, Dv)
    dq, dk, dv = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(v3)
    tiny = torch.finfo(qc.dtype).tiny

    def work(h0: int, h1: int) -> None:  # K/V heads [h0, h1) and their query heads
        f, fk, t = (qc.new_empty(N, Fd) for _ in range(3))  # phi(Q), phi(K), scratch
        a, da = qc.new_empty(nc, C, C), qc.new_empty(nc, C, C)
        dnum = qc.new_empty(nc, C, Dv)
        for h in range(h0, h1):
            s, z = states[h]  # (nc, F, Dv), (nc, F, 1) inclusive
            fk = phi_head(k3[h], proj_s, half_scale, fk, t, keys=True)  # (N, F)
            fkc, vch = fk.view(nc, C, Fd), v3[h].view(nc, C, Dv)
            dfk = torch.zeros_like(fk).view(nc, C, Fd)  # inside-chunk terms, over G heads
            dvh = dv[h].view(nc, C, Dv).zero_()
            dsx = s.new_zeros(nc, Fd, Dv)  # dS_<c of each chunk (0 for the first)
            dzx = z.new_zeros(nc, Fd, 1)
            for i in range(h * G, (h + 1) * G):
                fq = phi_head(q3[i], proj_s, half_scale, f, t, keys=False)  # (N, F)
                fqc, oc = fq.view(nc, C, Fd), o3[i].view(nc, C, Dv)
                torch.bmm(fqc, fkc.transpose(1, 2), out=a).tril_()  # key <= query
                den = a.sum(dim=-1, keepdim=True)  # (nc, C, 1)
                if nc > 1:
                    den[1:].baddbmm_(fqc[1:], z[:-1])
                torch.div(do3[i].view(nc, C, Dv), den.clamp_(min=tiny), out=dnum)
                dden = (dnum * oc).sum(dim=-1, keepdim=True).neg_()  # (nc, C, 1)
                torch.bmm(dnum, vch.transpose(1, 2), out=da).add_(dden)  # (nc, C, C)
                da.tril_()
                dfq = torch.bmm(da, fkc, out=t.view(nc, C, Fd))  # (nc, C, F)
                if nc > 1:  # through the states of earlier chunks
                    dfq[1:].baddbmm_(dnum[1:], s[:-1].transpose(1, 2))
                    dfq[1:].baddbmm_(dden[1:], z[:-1].transpose(1, 2))
                    dsx[1:].baddbmm_(fqc[1:].transpose(1, 2), dnum[1:])
                    dzx[1:].baddbmm_(fqc[1:].transpose(1, 2), dden[1:])
                dfk.baddbmm_(da.transpose(1, 2), fqc)  # (nc, C, F)
                dvh.baddbmm_(a.transpose(1, 2), dnum)  # (nc, C, Dv)
                phi_grad_into(q3[i], fq, dfq.view(N, Fd), proj_s, half_scale, dq[i],
                              keys=False)
            # chunk c's own state reaches chunks c+1, ...: its gradient is the sum of their
            # dS_<c' (reverse prefix sums; a loop, as the forward's: cumsum over the outer
            # dim is slow on CPU)
            for c in range(nc - 2, 0, -1):
                dsx[c].add_(dsx[c + 1])
                dzx[c].add_(dzx[c + 1])
            gs = torch.cat([dsx[1:], dsx.new_zeros(1, Fd, Dv)])  # (nc, F, Dv)
            gz = torch.cat([dzx[1:], dzx.new_zeros(1, Fd, 1)])  # (nc, F, 1)
            dfk.baddbmm_(vch, gs.transpose(1, 2)).add_(gz.transpose(1, 2))
            dvh.baddbmm_(fkc, gs)
            phi_grad_into(k3[h], fk, dfk.view(N, Fd), proj_s, half_scale, dk[h], keys=True)

    split_work(work, B * Hkv, qc.device)
    return dq.view(qc.shape), dk.view(kc.shape), dv.view(vc.shape)
