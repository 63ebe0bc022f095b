"""run_in_pieces (implementations/native/cpu_pieces.h): the fused kernels' one parallel
region a call, read through the segment kernel's ``pieces_run`` hook."""

import os
import signal
import time

import pytest
import torch
from kernel_paths import needs_native

from attnbench.core.case import Case
from attnbench.core.registry import get_backend
from attnbench.implementations import _native
from attnbench.implementations import _segment_attention as segments

pytestmark = needs_native


@pytest.fixture
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def pieces_run(n_items: int, pieces_per_thread: int, fail_at: int = -1):
    module, reason = _native.load(segments.KERNEL)
    assert module is not None, reason
    return module.pieces_run(n_items, pieces_per_thread, fail_at)


@pytest.mark.parametrize("threads", [2], indirect=True)
@pytest.mark.parametrize("n, per_thread", [(1, 8), (7, 8), (16, 8), (100, 8), (9, 1), (5, 4)])
def test_pieces_cover_every_item_once_in_balanced_contiguous_pieces(threads, n, per_thread):
    ran = sorted(pieces_run(n, per_thread))
    items = [i for lo, hi in ran for i in range(lo, hi)]
    assert items == list(range(n))
    sizes = [hi - lo for lo, hi in ran]
    assert len(ran) == min(n, threads * per_thread)
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("threads", [1], indirect=True)
def test_one_thread_runs_one_call_over_everything(threads):
    assert pieces_run(37, 8) == [(0, 37)]


@pytest.mark.parametrize("threads", [2], indirect=True)
def test_no_items_make_one_empty_call_so_the_kernel_still_checks_its_arguments(threads):
    assert pieces_run(0, 8) == [(0, 0)]


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_a_failing_piece_raises_its_error_and_the_next_call_runs(threads):
    with pytest.raises(RuntimeError, match=r"holds item 11"):
        pieces_run(40, 8, fail_at=11)
    assert sorted(pieces_run(40, 8))[-1][1] == 40


@pytest.mark.parametrize("threads", [2], indirect=True)
def test_a_forked_child_runs_the_kernels_single_threaded_instead_of_hanging(threads):
    """GNU OpenMP's pool does not survive fork: a region in the child would wait forever
    for the parent's threads. The child runs each call as one piece."""
    case = Case(batch=1, heads_q=4, heads_kv=4, seq_q=300, seq_k=300, head_dim=32,
                head_dim_v=32, mask="window(40,3)")
    inputs = case.make_inputs()
    fn = get_backend("sliding_window").build(case, inputs)
    expected = fn(inputs.q, inputs.k, inputs.v)  # the parent's region starts the pool
    assert len(pieces_run(64, 8)) == 16
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if both calls finish with the parent's results
        pieces = pieces_run(64, 8)
        out = fn(inputs.q, inputs.k, inputs.v)  # 2 threads: the kernel's own region
        torch.set_num_threads(1)  # torch.equal's region would hang here otherwise
        os._exit(0 if pieces == [(0, 64)] and torch.equal(out, expected) else 1)
    deadline = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung in the kernel's parallel region")
    assert os.waitstatus_to_exitcode(done[1]) == 0


@pytest.mark.parametrize("threads", [2], indirect=True)
def test_a_kernel_error_in_a_piece_reaches_the_caller_as_its_message(threads):
    plan = segments.window_segments(256, 256, 31, 0, 32)
    q, k, v = (torch.randn(1, 2, 256, 16) for _ in range(3))
    wrong_out = torch.empty(1, 2, 255, 16)  # one row short
    module, _ = _native.load(segments.KERNEL)
    with pytest.raises(RuntimeError, match=r"out must be a contiguous \(B, Hq, Nq, Dv\)"):
        module.segment_attention_forward_parallel(
            q, k, v, wrong_out, torch.empty(0), plan.ptr, plan.start, plan.length, plan.block,
            plan.lo_off, plan.hi_off, 0.25, 8)
