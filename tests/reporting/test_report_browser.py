"""The HTML report in a real browser: headless Chromium, driven over the DevTools protocol on
a pipe (no driver, no websocket package). Every image must render (naturalWidth > 0), no
request may leave the report's folder (its SVG charts sit beside the page), and a
full-page screenshot is saved for a person to look at ($ATTNBENCH_ARTIFACTS, else the
test's temporary folder).

Skips, saying why, where Chromium is not installed (.ci/run installs Debian's package).
"""

import base64
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from test_report import write_run

from attnbench.reporting.report import build_report

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WIDTH = 1280
MAX_HEIGHT = 16000  # Chromium's largest capture


def find_browser() -> str | None:
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


class DevTools:
    """Chromium with --remote-debugging-pipe: commands go in on its fd 3, replies and events
    come out on its fd 4, each a JSON message ending in a NUL byte."""

    def __init__(self, exe: str, profile: Path):
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()
        args = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                f"--user-data-dir={profile}", "--no-first-run", "--no-default-browser-check",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-extensions", "--disable-default-apps",
                "--mute-audio", "--host-resolver-rules=MAP * ~NOTFOUND", "about:blank"]
        # bash maps our pipe ends onto the descriptors Chromium expects (3 in, 4 out); a
        # POSIX sh may refuse descriptors above 9
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{to_child_r} 4>&{from_child_w}', *args],
            pass_fds=(to_child_r, from_child_w), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict] = []

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.from_child], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self.from_child, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        for i, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(i)
        while True:
            event = self._read(deadline)
            if event.get("method") == method:
                return event
            self.events.append(event)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self.to_child)
        os.close(self.from_child)


IMAGES = """JSON.stringify(Array.from(document.images).map(i => ({
  alt: i.alt, complete: i.complete, width: i.naturalWidth, height: i.naturalHeight,
  scheme: i.src.split(':')[0]})))"""


def test_html_report_renders_offline_in_chromium(tmp_path):
    exe = find_browser()
    if exe is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium; .ci/run "
                    "installs it when it can)")
    if shutil.which("bash") is None:
        pytest.skip("bash is needed to hand Chromium its DevTools pipe on descriptors 3 and 4")
    out = build_report([write_run(tmp_path)], tmp_path / "report")
    page = (out / "index.html").resolve().as_uri()
    browser = DevTools(exe, tmp_path / "profile")
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target,
                                                         "flatten": True})["sessionId"]
        for domain in ("Page.enable", "Network.enable"):
            browser.send(domain, session=session)
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": WIDTH, "height": 900, "deviceScaleFactor": 1, "mobile": False},
                     session=session)
        browser.send("Page.navigate", {"url": page}, session=session)
        browser.wait_for("Page.loadEventFired")
        result = browser.send("Runtime.evaluate", {"expression": IMAGES, "returnByValue": True},
                              session=session)
        images = json.loads(result["result"]["value"])
        height = browser.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
        shot = browser.send("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": WIDTH,
                     "height": min(height["height"], MAX_HEIGHT), "scale": 1}},
            session=session, timeout=120)
    finally:
        browser.close()
    requests = [e["params"]["request"]["url"] for e in browser.events
                if e.get("method") == "Network.requestWillBeSent"]

    artifacts = Path(os.environ.get("ATTNBENCH_ARTIFACTS") or tmp_path)
    artifacts.mkdir(parents=True, exist_ok=True)
    screenshot = artifacts / "report-screenshot.png"
    screenshot.write_bytes(base64.b64decode(shot["data"]))
    print(f"screenshot: {screenshot}")

    assert len(images) == 6, images
    for img in images:
        assert img["complete"] and img["width"] > 0 and img["height"] > 0, img
        assert img["scheme"] == "file" and img["alt"], img
    folder = out.resolve().as_uri() + "/"
    leaving = [u for u in requests if not (u == page or u.startswith(folder))]
    assert not leaving, f"requests that leave the file: {leaving}"
    assert page in requests  # the observer saw the page's own request
    assert screenshot.stat().st_size > 10_000
