"""The run-wide cache of inputs and float64 references (attnbench.measure.case_cache)."""

import torch

from attnbench.core.case import Case
from attnbench.core.reference import case_reference
from attnbench.measure.case_cache import CaseCache, inputs_key

SHAPE = dict(batch=1, heads_q=2, heads_kv=1, seq_q=24, seq_k=40, head_dim=8, head_dim_v=8)


def test_one_set_of_inputs_serves_every_mask_mode_and_backend():
    cache = CaseCache()
    fwd = Case(**SHAPE, mask="causal", mode="fwd")
    got_fwd = cache.inputs_for(fwd)
    assert got_fwd.grad_out is None
    got_bwd = cache.inputs_for(fwd.replace(mode="bwd", mask="none"))
    assert got_bwd.grad_out is not None and got_bwd.grad_out.shape == (1, 2, 24, 8)
    assert torch.equal(got_bwd.q, got_fwd.q) and torch.equal(got_bwd.v, got_fwd.v)
    again = cache.inputs_for(fwd.replace(mode="fwd_bwd", mask="window(3,0)"))
    assert again.q is got_bwd.q and again.grad_out is got_bwd.grad_out  # no new draw
    assert cache.inputs_for(fwd).grad_out is None  # a forward case never sees a grad_out
    assert cache.made["inputs"] == 2  # the first draw, then once more to add grad_out
    # the values are the case's own, whatever the cache did
    fresh = fwd.replace(mode="bwd").make_inputs()
    assert torch.equal(fresh.k, again.k) and torch.equal(fresh.grad_out, again.grad_out)
    cache.inputs_for(fwd.replace(seed=1))
    assert cache.made["inputs"] == 3 and inputs_key(fwd) != inputs_key(fwd.replace(seed=1))


def test_one_reference_with_gradients_serves_both_backward_modes_and_the_forward():
    cache = CaseCache()
    case = Case(**SHAPE, mask="causal", mode="bwd")
    ref = cache.reference_for(case)
    assert ref.dq is not None
    assert cache.reference_for(case.replace(mode="fwd_bwd")) is ref
    fwd = cache.reference_for(case.replace(mode="fwd"))
    assert fwd.dq is None and fwd.out is ref.out
    assert cache.made["reference"] == 1
    other = cache.reference_for(case.replace(mask="none"))  # another mask: its own
    assert cache.made["reference"] == 2 and not torch.equal(other.out, ref.out)
    direct = case_reference(case, case.make_inputs())
    assert torch.equal(direct.dk, ref.dk) and torch.equal(direct.out, ref.out)


def test_entries_beyond_the_budget_go_oldest_first_but_never_the_groups_own():
    small = Case(**SHAPE, mode="fwd")
    size = sum(t.numel() * t.element_size() for t in
               (lambda i: (i.q, i.k, i.v))(small.make_inputs()))
    cache = CaseCache(budget=2 * size)
    cases = [small.replace(seed=s) for s in range(4)]
    for c in cases:
        cache.keep_only([c])
        cache.inputs_for(c)
    assert cache.held_bytes <= 3 * size  # the budget plus the newest group's own
    cache.keep_only([cases[3]])
    assert cache.held_bytes <= 2 * size
    kept = [c.seed for c in cases if ("inputs", inputs_key(c)) in cache.entries]
    assert kept[-1] == 3 and 0 not in kept
    cache.keep_only([cases[0], cases[3]])
    cache.inputs_for(cases[0])  # evicted earlier: drawn again
    assert cache.made["inputs"] == 5
