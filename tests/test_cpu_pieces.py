"""run_in_pieces (implementations/native/cpu_pieces.h): the fused kernels' one parallel
region a call, read through the segment kernel's ``pieces_run`` hook."""

import pytest
import torch
from kernel_paths import needs_native

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
def test_no_items_run_nothing(threads):
    assert pieces_run(0, 8) == []


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_a_failing_piece_raises_its_error_and_the_next_call_runs(threads):
    with pytest.raises(RuntimeError, match=r"holds item 11"):
        pieces_run(40, 8, fail_at=11)
    assert sorted(pieces_run(40, 8))[-1][1] == 40
