"""split_work: the blocked backends' coarse-grained CPU threads (implementations/_cpu_threads)."""

import os
import threading

import pytest
import torch

from attnbench.core.case import Case
from attnbench.core.registry import get_backend
from attnbench.implementations import _cpu_threads
from attnbench.implementations._cpu_threads import ranges, split_work


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("n, parts", [(0, 2), (1, 2), (7, 2), (8, 3), (3, 5), (100, 7)])
def test_ranges_cover_every_item_once_in_balanced_contiguous_parts(n, parts):
    cut = ranges(n, parts)
    items = [i for lo, hi in cut for i in range(lo, hi)]
    assert items == list(range(n))
    sizes = [hi - lo for lo, hi in cut]
    assert len(cut) == max(1, min(parts, n)) and max(sizes) - min(sizes) <= 1


def test_split_work_runs_each_item_once_on_both_threads_single_threaded(two_threads):
    seen = []
    both = threading.Barrier(2, timeout=30)  # each thread's first piece waits for the other

    def work(lo, hi):
        ident = threading.get_ident()
        if ident not in {i for *_, i, _, _ in seen}:
            seen.append((lo, hi, ident, torch.get_num_threads(), torch.is_grad_enabled()))
            both.wait()
        else:
            seen.append((lo, hi, ident, torch.get_num_threads(), torch.is_grad_enabled()))

    split_work(work, 9, "cpu")
    items = sorted(i for lo, hi, *_ in seen for i in range(lo, hi))
    assert items == list(range(9))  # every item once
    assert all(hi - lo == 1 for lo, hi, *_ in seen)  # 9 items, 16 pieces wanted: one each
    assert len({ident for _, _, ident, _, _ in seen}) == 2  # two threads
    assert all(t == 1 and not grad for *_, t, grad in seen)  # ops on the caller's thread
    assert torch.get_num_threads() == 2  # restored


def test_a_slowed_thread_leaves_the_remaining_pieces_to_the_other(two_threads):
    """Fixed halves would leave half the items to the slowed thread: here the piece that
    is held up waits until every other piece has run, which only the other thread can do."""
    n = 2 * 4  # 2 threads x 4 pieces: one item a piece
    done, held = [], []
    others_done = threading.Event()

    def work(lo, hi):
        if not held:
            held.append(threading.get_ident())
            assert others_done.wait(timeout=30), "the other thread did not take the pieces"
        else:
            done.append((lo, threading.get_ident()))
            if len(done) == n - 1:
                others_done.set()

    split_work(work, n, "cpu", pieces_per_thread=4)
    assert len(done) == n - 1 and held[0] not in {t for _, t in done}


def test_one_thread_or_one_item_is_one_plain_call(two_threads):
    calls = []
    split_work(lambda lo, hi: calls.append((lo, hi, torch.get_num_threads())), 1, "cpu")
    torch.set_num_threads(1)
    split_work(lambda lo, hi: calls.append((lo, hi, torch.get_num_threads())), 6, "cpu")
    assert calls == [(0, 1, 2), (0, 6, 1)]


def test_an_error_is_raised_after_the_running_pieces_ended(two_threads):
    started, ended = [], []

    def work(lo, hi):
        started.append(lo)
        if lo == 0:
            raise ValueError("piece 0 failed")
        ended.append(lo)

    with pytest.raises(ValueError, match="piece 0 failed"):
        split_work(work, 64, "cpu", pieces_per_thread=32)
    assert sorted(ended) == sorted(s for s in started if s != 0)  # none left running
    assert torch.get_num_threads() == 2


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_a_pool_of_its_own(two_threads):
    split_work(lambda lo, hi: None, 2, "cpu")  # the parent's pool exists now
    pid = os.fork()
    if pid == 0:  # the child: the inherited pool has no threads; a new one must serve
        done = []
        split_work(lambda lo, hi: done.append(lo), 2, "cpu")
        os._exit(0 if sorted(done) == [0, 1] else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _cpu_threads._pool_pid == os.getpid()


def test_the_callers_inference_mode_reaches_every_range(two_threads):
    """Tensors made in inference mode may only be written in it, and the mode is per
    thread: a backend called under torch.inference_mode() (as model code is) failed with
    'Inplace update to inference tensor outside InferenceMode' on its pool thread."""
    with torch.inference_mode():
        out = torch.zeros(4)

        def work(lo, hi):
            out[lo:hi] = torch.is_inference_mode_enabled()

        split_work(work, 4, "cpu")
    assert out.tolist() == [1.0] * 4
    modes = []
    split_work(lambda lo, hi: modes.append(torch.is_inference_mode_enabled()), 2, "cpu")
    assert modes == [False, False]


def test_every_range_computes_under_the_callers_cpu_autocast(two_threads):
    a = torch.randn(8, 8)
    dtypes = [None, None]

    def work(lo, hi):
        dtypes[lo] = torch.mm(a, a).dtype

    with torch.autocast("cpu", dtype=torch.bfloat16):
        split_work(work, 2, "cpu")
    assert dtypes == [torch.bfloat16, torch.bfloat16]
    split_work(work, 2, "cpu")
    assert dtypes == [torch.float32, torch.float32]


CASES = [
    ("sliding_window", dict(mask="window(40,3)", heads_q=4, heads_kv=2)),
    ("block_sparse", dict(mask="block_sparse(bigbird)", block_size=16)),
    ("linear", dict(mask="none", feature_map="elu")),
    ("linear", dict(mask="causal", feature_map="favor")),
]


@pytest.mark.parametrize("name, knobs", CASES, ids=[f"{n}-{k['mask']}" for n, k in CASES])
@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
def test_outputs_and_gradients_do_not_depend_on_the_thread_count(name, knobs, mode):
    """The work is shared out by ranges that never write the same element, so two threads
    compute what one does (each op runs single-threaded either way)."""
    kwargs = dict(batch=2, heads_q=4, heads_kv=4, seq_q=256, seq_k=256, head_dim=32,
                  head_dim_v=32, mode=mode) | knobs
    case = Case(**kwargs)
    backend = get_backend(name)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            inputs = case.make_inputs()
            q, k, v = (t.detach().requires_grad_(mode != "fwd")
                       for t in (inputs.q, inputs.k, inputs.v))
            fn = backend.build(case, inputs)
            out = fn(q, k, v)
            grads = torch.autograd.grad(out, (q, k, v), inputs.grad_out) if mode != "fwd" else ()
            results.append((out.detach(), *grads))
            if mode == "fwd":  # as model code calls it
                with torch.inference_mode():
                    torch.testing.assert_close(fn(inputs.q, inputs.k, inputs.v), out.detach(),
                                               rtol=0, atol=0)
    finally:
        torch.set_num_threads(before)
    for one, two in zip(*results):
        torch.testing.assert_close(two, one, rtol=1e-6, atol=1e-6)
