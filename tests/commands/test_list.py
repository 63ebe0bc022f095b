"""`attnbench list`: capabilities, and a closed pipe survived."""

from __future__ import annotations


def test_list_shows_capabilities_and_survives_a_closed_pipe():
    import subprocess
    import sys
    text = subprocess.run([sys.executable, "-m", "attnbench", "list"], capture_output=True,
                          text=True, check=True).stdout
    assert "supports: devices" in text and "knobs feature_map, num_features" in text
    piped = subprocess.run(f"{sys.executable} -m attnbench list --json | head -1",
                           shell=True, capture_output=True, text=True)
    assert piped.stdout == "[\n" and "Traceback" not in piped.stderr, piped.stderr
