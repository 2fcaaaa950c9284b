"""The evidence page of `attest serve all --embedded`, in a real headless Chromium.

Chromium is driven over the Chrome DevTools Protocol (aiohttp's WebSocket
client) with keyboard events: the API key and a question are typed in and
Enter asks; the streamed answer renders with its citations and their
confidence bars; Enter on the first citation opens its passage with the
supporting span marked; "Supports" saves a label, which `attest eval
export-labels` then writes as a support pair. A screenshot of each state is
saved under the test's temporary directory.

Chromium comes from Debian (`apt-get install chromium`; .ci/test.sh installs
it). Without it the test is skipped locally and fails under CI=true.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.front_door import QUESTION, FrontDoor, front_door

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

CLI = [sys.executable, "-m", "attest.cli"]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    message = "no Chromium: apt-get install -y chromium (.ci/test.sh installs it)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@contextmanager
def browser(tmp_path: Path) -> Iterator[int]:
    """A headless Chromium; yields its DevTools port."""
    profile = tmp_path / "profile"
    process = subprocess.Popen(
        [
            chromium(),
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "--window-size=1280,900",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "chromium.log").open("wb"),
    )
    try:
        marker = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (marker.exists() and marker.read_text().strip()):
            assert process.poll() is None, (tmp_path / "chromium.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "Chromium did not open its DevTools port"
            time.sleep(0.2)
        yield int(marker.read_text().split()[0])
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Page:
    """One tab, spoken to over the DevTools Protocol."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        n = next(self._ids)
        await self._ws.send_json({"id": n, "method": method, "params": params})
        while True:
            message = await self._ws.receive_json(timeout=60)
            if message.get("id") == n:
                assert "error" not in message, message
                return dict(message.get("result", {}))

    async def js(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    async def until(self, expression: str, within: float = 120) -> Any:
        deadline = time.monotonic() + within
        while True:
            value = await self.js(expression)
            if value:
                return value
            assert time.monotonic() < deadline, f"timed out waiting for {expression}"
            await asyncio.sleep(0.2)

    async def type(self, text: str) -> None:
        for char in text:
            await self.send("Input.dispatchKeyEvent", type="char", text=char)

    async def key(self, name: str) -> None:
        codes = {"Enter": 13, "Tab": 9, "Escape": 27}
        event = {"key": name, "code": name, "windowsVirtualKeyCode": codes[name]}
        text = {"Enter": "\r"}.get(name)
        await self.send(
            "Input.dispatchKeyEvent", type="keyDown", **event, **({"text": text} if text else {})
        )
        await self.send("Input.dispatchKeyEvent", type="keyUp", **event)

    async def screenshot(self, path: Path) -> None:
        shot = await self.send("Page.captureScreenshot", format="png")
        await asyncio.to_thread(path.write_bytes, base64.b64decode(shot["data"]))


@asynccontextmanager
async def page(port: int) -> AsyncIterator[Page]:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/json/list") as reply:
            targets = await reply.json()
        target = next(t for t in targets if t["type"] == "page")
        async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            tab = Page(ws)
            await tab.send("Page.enable")
            await tab.send("Runtime.enable")
            await tab.send(
                "Emulation.setDeviceMetricsOverride",
                width=1280,
                height=900,
                deviceScaleFactor=1,
                mobile=False,
            )
            yield tab


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontDoor]:
    with front_door(tmp_path_factory.mktemp("page")) as running:
        yield running


#: Run in the tab before the page's own script. It reads a copy of the answer's
#: event stream for the ``: sent-at`` comment of the first ``sentence`` event
#: (when the server wrote it, Unix seconds) and notes when the first cited
#: sentence is in the DOM and when the frame after that is drawn, on the same
#: clock (performance.timeOrigin + performance.now(), Unix milliseconds; the
#: browser and the server share the machine's clock).
TIMING = r"""
(() => {
  const timing = window.__timing = {sentAt: null, inDom: null, drawn: null};
  const now = () => (performance.timeOrigin + performance.now()) / 1000;
  const fetched = window.fetch;
  window.fetch = async (...args) => {
    const reply = await fetched(...args);
    if (!String(args[0]).endsWith('/v1/ask:stream') || !reply.ok) return reply;
    const [page, copy] = reply.body.tee();
    (async () => {
      const reader = copy.getReader(), decoder = new TextDecoder();
      let text = '';
      for (;;) {
        const {value, done} = await reader.read();
        if (done) return;
        text += decoder.decode(value, {stream: true});
        const found = text.match(/: sent-at ([0-9.]+)\nevent: sentence\n/);
        if (found) { timing.sentAt = Number(found[1]); return; }
      }
    })();
    return new Response(page, {status: reply.status, headers: reply.headers});
  };
  document.addEventListener('DOMContentLoaded', () => {
    const seen = new MutationObserver(() => {
      if (timing.inDom === null && document.querySelector('#answer .sentence:not(.draft)')) {
        timing.inDom = now();
        requestAnimationFrame(() => { timing.drawn = now(); });
        seen.disconnect();
      }
    });
    seen.observe(document.getElementById('answer'), {childList: true, subtree: true});
  });
})();
"""


async def walk_through(tab: Page, door: FrontDoor, shots: Path) -> dict[str, Any]:
    await tab.send("Page.addScriptToEvaluateOnNewDocument", source=TIMING)
    await tab.send("Page.navigate", url=f"{door.http}/")
    await tab.until("document.readyState === 'complete' && !!document.getElementById('question')")
    loaded = await tab.until(
        "(n => n && n.loadEventEnd > 0 ? (n.loadEventEnd - n.startTime) / 1000 : 0)"
        "(performance.getEntriesByType('navigation')[0])"
    )
    # Keyboard only: the key field, then the question, then Enter.
    await tab.js("document.getElementById('key').focus()")
    await tab.type(door.keys["acme"])
    await tab.key("Tab")
    assert await tab.js("document.activeElement.id") == "question"
    await tab.type(QUESTION)
    await tab.screenshot(shots / "1-question.png")
    await tab.key("Enter")

    await tab.until("state !== null && state.done === true")
    timing = await tab.until(
        "(t => t.sentAt !== null && t.drawn !== null ? t : null)(window.__timing)", within=10
    )
    answer = await tab.js(
        """(() => ({
            text: [...document.querySelectorAll('#answer .sentence')].map(s => s.textContent),
            citations: document.querySelectorAll('#answer .cite').length,
            bars: [...document.querySelectorAll('#answer .cite .bar > span')].map(b => b.style.width),
            status: document.getElementById('status').textContent,
        }))()"""
    )
    await tab.screenshot(shots / "2-answer.png")

    await tab.js("document.querySelector('#answer .cite').focus()")
    await tab.key("Enter")
    await tab.until("!!document.getElementById('passage')")
    opened = await tab.js(
        """(() => {
            const o = state.open, s = state.sentences[o.sentence].sentence;
            const c = s.citations[o.citation];
            const src = state.sources[c.sourceIndex].source;
            const mark = document.getElementById('span');
            return {sentence: s.text, passage: src.text, docId: src.docId,
                    mark: mark && mark.textContent, how: mark && mark.dataset.how,
                    where: document.getElementById('where').textContent,
                    kg: !!document.getElementById('kg'),
                    focused: document.activeElement.id};
        })()"""
    )
    await tab.screenshot(shots / "3-citation.png")

    await tab.js("document.getElementById('supports').focus()")
    await tab.key("Enter")
    saved = await tab.until(
        "(t => t.startsWith('Saved') || t.startsWith('Not saved') ? t : '')"
        "(document.getElementById('saved').textContent)"
    )
    await tab.screenshot(shots / "4-labelled.png")
    await tab.key("Escape")
    closed = await tab.js("document.getElementById('passage') === null")
    return {
        "answer": answer,
        "opened": opened,
        "saved": saved,
        "closed": closed,
        "load": loaded,
        "timing": timing,
    }


def test_ask_read_the_evidence_and_label_it(door: FrontDoor, tmp_path: Path) -> None:
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with browser(tmp_path) as port:

        async def run() -> dict[str, Any]:
            async with page(port) as tab:
                return await walk_through(tab, door, shots)

        seen = asyncio.run(run())

    answer, opened = seen["answer"], seen["opened"]
    # The page loads, and shows the first sentence once the server has sent it,
    # each within a second.
    timing = seen["timing"]
    in_dom, drawn = timing["inDom"] - timing["sentAt"], timing["drawn"] - timing["sentAt"]
    print(
        f"page load {seen['load'] * 1000:.0f} ms; first sentence in the DOM "
        f"{in_dom * 1000:.0f} ms and drawn {drawn * 1000:.0f} ms after the server sent it"
    )
    assert 0 < seen["load"] <= 1.0, seen["load"]
    # sent-at has millisecond precision, hence the -0.001.
    assert -0.001 <= in_dom <= drawn <= 1.0, timing
    assert any("$14.5 million" in line for line in answer["text"]), answer
    assert answer["citations"] >= 1
    assert all(width.endswith("%") for width in answer["bars"]), answer
    assert answer["status"].startswith("Done:"), answer
    # The passage opened with its supporting span marked, found in its text.
    assert opened["mark"], opened
    assert opened["mark"] in opened["passage"]
    assert opened["how"] in ("quote", "sentence", "overlap")
    assert opened["where"].startswith(f"document {opened['docId']}")
    assert opened["focused"] == "detail"
    assert seen["saved"] == "Saved: supports", seen
    assert seen["closed"]
    for name in ("1-question", "2-answer", "3-citation", "4-labelled"):
        assert (shots / f"{name}.png").stat().st_size > 10_000, name

    exported = subprocess.run(
        [*CLI, "eval", "export-labels", "--tenant", "acme"],
        env={**os.environ, "ATTEST_DATA_DIR": str(door.data_dir)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    pairs = [json.loads(line) for line in exported.stdout.splitlines()]
    assert len(pairs) == 1, exported.stdout
    pair = pairs[0]
    assert set(pair) == {"id", "task", "source", "sentence", "label"}
    assert (pair["task"], pair["label"]) == ("support", 1)
    assert (pair["sentence"], pair["source"]) == (opened["sentence"], opened["passage"])
    assert "1 labels of tenant acme" in exported.stderr
    # Marks are the tenant's own: another tenant has none.
    other = subprocess.run(
        [*CLI, "eval", "export-labels", "--tenant", "other"],
        env={**os.environ, "ATTEST_DATA_DIR": str(door.data_dir)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert other.stdout == ""
    keep = os.environ.get("ATTEST_PAGE_SCREENSHOTS")
    if keep:
        shutil.copytree(shots, keep, dirs_exist_ok=True)
