"""The worker's address-space cap (--max-memory) bounds pairs, not the device ceilings."""

from __future__ import annotations

from attnbench.measure.worker import IsolatedExecutor, WorkerConfig


def test_ceilings_are_measured_under_the_smallest_max_memory():
    executor = IsolatedExecutor(config=WorkerConfig(1, 2**30))  # 1G, the documented minimum
    try:
        ceilings = executor.ceilings(["float32"], "cpu")
    finally:
        executor.close()
    assert "error" not in ceilings, ceilings
    assert ceilings["matmul_tflops"]["float32"] > 0


def test_worker_log_is_cut_to_its_tail_between_groups(tmp_path, monkeypatch):
    from attnbench.measure import worker

    monkeypatch.setattr(worker, "LOG_LIMIT", 1000)
    monkeypatch.setattr(worker, "LOG_KEEP", 100)
    log = tmp_path / "worker.log"
    log.write_bytes(b"".join(b"line %04d\n" % i for i in range(300)))  # 3,000 bytes
    executor = IsolatedExecutor(config=WorkerConfig(log_path=str(log)))
    executor.log_offset = 2950  # the current worker started near the end
    executor._trim_log()
    text = log.read_bytes()
    assert text.startswith(b"[attnbench: 2900 earlier bytes of worker output dropped")
    assert text.endswith(b"line 0299\n") and len(text) < 1000
    assert text[executor.log_offset:] == b"line 0295\nline 0296\nline 0297\nline 0298\n" \
        b"line 0299\n"
    executor._trim_log()  # under the limit now: left alone
    assert log.read_bytes() == text
