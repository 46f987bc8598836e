"""A real browser against the real product: headless Chromium (Selenium) logs in, watches
the overview update live while chat requests flow through the gateway to simulated vLLM
workers, edits a routing weight, and leaves PNG screenshots that must be non-trivial."""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from controlplane.common.auth import OPERATOR, Actor
from controlplane.policies import services as psvc
from controlplane.policies.models import PolicyVersion
from controlplane.registry import services as rsvc
from controlplane.telemetry.models import FleetSample, RequestRecord

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
OPS = Actor(label="test", scope=OPERATOR)
MODEL = "sim-8b"
SYSTEMS = [
    " ".join(f"tenant {t} rule {i}: answer briefly, cite the cached context." for i in range(30))
    for t in range(3)
]

pytestmark = [
    pytest.mark.browser,
    # WhiteNoise hands Django's ASGI handler a sync file iterator for static files; Django
    # serves it anyway but warns, and the suite turns warnings into errors process-wide,
    # which would break the server threads' static responses (not the product).
    pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume synchronous iterators"),
    pytest.mark.slow,
    pytest.mark.skipif(
        not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
        reason="needs Debian chromium + chromium-driver (make test installs them when apt works)",
    ),
]


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of raw pixels) of an 8-bit RGB/RGBA non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and interlace == 0 and color in (2, 6)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    prev = bytearray(stride)
    i = 0
    for _ in range(height):
        ftype, line = raw[i], bytearray(raw[i + 1 : i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - channels] if x >= channels else 0
            b = prev[x]
            c = prev[x - channels] if x >= channels else 0
            if ftype == 1:
                line[x] = (line[x] + a) & 0xFF
            elif ftype == 2:
                line[x] = (line[x] + b) & 0xFF
            elif ftype == 3:
                line[x] = (line[x] + (a + b) // 2) & 0xFF
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[x] = (line[x] + pred) & 0xFF
        rows.append(bytes(line))
        prev = line
    return (
        width,
        height,
        [bytes(r[k : k + 3]) for r in rows[::8] for k in range(0, stride, channels * 8)],
    )


def assert_non_trivial_png(path: Path) -> None:
    data = path.read_bytes()
    assert len(data) > 20_000, f"{path} is only {len(data)} bytes"
    width, height, samples = png_pixels(data)
    assert width >= 1000 and height >= 700
    colours = set(samples)
    # A blank or error page has a handful of colours; charts, text and badges have many.
    assert len(colours) > 50, f"only {len(colours)} distinct colours in {path}"
    non_white = sum(1 for s in samples if s != b"\xff\xff\xff")
    assert non_white / len(samples) > 0.2


@pytest.fixture
def product(
    transactional_db: None, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Any]]:
    """Simulated workers, the registry and an active policy, and the whole product
    (control plane + gateway + dashboard + embedded jobs) served by uvicorn."""
    from tests.gateway.conftest import SimFleet

    settings.KVROUTE_TELEMETRY_DRAIN_INTERVAL_S = 0.5
    settings.KVROUTE_TELEMETRY_SCRAPE_INTERVAL_S = 1.0
    # No worker agent heartbeats here; registration's heartbeat must last the whole test.
    settings.KVROUTE_HEARTBEAT_TIMEOUT_S = 600.0
    monkeypatch.setenv("KVROUTE_EMBEDDED_JOBS", "1")
    fleet = SimFleet(2, model=MODEL, time_scale=0.05).start()
    server = None
    try:
        for i, (w, url) in enumerate(zip(fleet.workers, fleet.urls, strict=True)):
            rsvc.worker_register(
                name=f"sim-{i}",
                base_url=url,
                model=MODEL,
                kv_events_endpoint=w.events_endpoint,
                replay_endpoint=w.replay_endpoint,
                labels={"tokenizer": "builtin"},
                actor=OPS,
            )
        psvc.policy_create(name="kv-default", model=MODEL, type="kv_score", params={}, actor=OPS)
        psvc.policy_activate(policy_name="kv-default", version=1, actor=OPS)
        from django.contrib.auth.models import User

        User.objects.create_user("operator", password="op-pass-4321", is_staff=True)

        from controlplane.asgi import application
        from routing.gateway.serve import ServerThread

        server = ServerThread(application, lifespan="on").start(timeout_s=30)
        yield {"url": server.url, "fleet": fleet}
    finally:
        if server is not None:
            server.server.should_exit = True
            server.thread.join(15)
        fleet.stop()


class Traffic:
    """Chat requests with shared system prompts through the gateway, until stopped."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.sent = 0
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True, name="traffic")

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self.stop.is_set():
                n = self.sent
                body = {
                    "model": MODEL,
                    "messages": [
                        {"role": "system", "content": SYSTEMS[n % len(SYSTEMS)]},
                        {"role": "user", "content": f"question {n}: what changed?"},
                    ],
                    "max_tokens": 8,
                    "stream": n % 2 == 0,
                }
                try:
                    resp = client.post(
                        "/v1/chat/completions", json=body, headers={"x-session-id": f"s{n % 5}"}
                    )
                    if resp.status_code != 200:
                        self.errors.append(f"{resp.status_code} {resp.text[:200]}")
                except httpx.HTTPError as exc:
                    self.errors.append(repr(exc))
                self.sent += 1
                self.stop.wait(0.05)

    def __enter__(self) -> Traffic:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def chromium() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1440,1100",
        f"--user-data-dir={tempfile.mkdtemp(prefix='kvroute-chromium-')}",
    ):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def wait_for(driver: Any, script: str, *, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = driver.execute_script(script)
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_operator_watches_live_traffic_and_tunes_a_weight(
    product: dict[str, Any], tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    url = product["url"]
    driver = chromium()
    try:
        with Traffic(url) as traffic:
            driver.get(url + "/")
            assert "/login/" in driver.current_url
            driver.find_element(By.ID, "id_username").send_keys("operator")
            driver.find_element(By.ID, "id_password").send_keys("op-pass-4321")
            driver.find_element(By.ID, "login-submit").click()
            wait_for(
                driver,
                "return document.getElementById('overview') !== null",
                timeout_s=10,
                what="the overview",
            )
            wait_for(
                driver,
                "return window.kvrouteDashboard && window.kvrouteDashboard.status === 'live'",
                timeout_s=15,
                what="the websocket to go live",
            )
            before = driver.execute_script("return window.kvrouteDashboard.updates")
            # A websocket update arrives and the request-rate chart shows points from it.
            wait_for(
                driver,
                f"return window.kvrouteDashboard.updates > {before}"
                " && document.getElementById('chart-rps').data[0].y.some(v => v > 0)"
                " && document.getElementById('chart-ttft').data[1].y.some(v => v > 0)",
                timeout_s=30,
                what="a live chart update with traffic",
            )
            # Per-worker queue / KV charts grew a trace per simulated worker from fleet scrapes.
            wait_for(
                driver,
                "return document.getElementById('chart-kv_usage').data.length >= 2",
                timeout_s=20,
                what="per-worker fleet traces",
            )
            # Hidden tab: the page closes its socket and stops drawing; shown again, it
            # reloads the snapshot and reconnects.
            driver.execute_script(
                "Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});"
                "document.dispatchEvent(new Event('visibilitychange'));"
            )
            assert driver.execute_script("return window.kvrouteDashboard.status") == "paused"
            assert driver.execute_script("return window.kvrouteDashboard.socket") is None
            paused_draws = driver.execute_script("return window.kvrouteDashboard.draws")
            time.sleep(1.5)
            assert driver.execute_script("return window.kvrouteDashboard.draws") == paused_draws
            driver.execute_script(
                "Object.defineProperty(document, 'hidden', {configurable: true, get: () => false});"
                "document.dispatchEvent(new Event('visibilitychange'));"
            )
            wait_for(
                driver,
                "return window.kvrouteDashboard.status === 'live'"
                f" && window.kvrouteDashboard.draws > {paused_draws}",
                timeout_s=15,
                what="the page to resume after the tab is shown",
            )
            time.sleep(2.5)  # a few more points, so the screenshot shows lines, not dots
            assert driver.save_screenshot(str(tmp_path / "overview.png"))
            assert not traffic.errors, traffic.errors[:3]
            assert RequestRecord.objects.filter(worker_id__in=["sim-0", "sim-1"]).exists()
            assert FleetSample.objects.filter(worker_id="sim-0", ok=True).exists()

            # The workers table shows both simulated workers with live metrics and actions.
            driver.get(url + "/workers/")
            table = driver.find_element(By.TAG_NAME, "table").text
            assert "sim-0" in table and "sim-1" in table and "healthy" in table and "Drain" in table
            driver.save_screenshot(str(tmp_path / "workers.png"))
            driver.find_element(By.LINK_TEXT, "sim-0").click()
            wait_for(
                driver,
                "return document.getElementById('chart-kv_usage') && document.getElementById('chart-kv_usage').data"
                " && document.getElementById('chart-kv_usage').data[0].x.length > 0",
                timeout_s=10,
                what="the worker's charts",
            )
            driver.save_screenshot(str(tmp_path / "worker.png"))

            # The request explorer explains a routed request: its candidates and score terms.
            driver.get(url + "/requests/")
            driver.find_element(By.CSS_SELECTOR, "td a[href^='/requests/']").click()
            wait_for(
                driver,
                "return document.getElementById('chart-why') && document.getElementById('chart-why').data",
                timeout_s=10,
                what="the score breakdown chart",
            )
            assert "chosen" in driver.find_element(By.TAG_NAME, "table").text
            driver.save_screenshot(str(tmp_path / "request.png"))

            # Edit a weight: the form is generated from the policy's schema; save and activate.
            driver.get(url + "/policies/kv-default/")
            field = driver.find_element(By.ID, "id_param__cache_weight")
            field.clear()
            field.send_keys("2.5")
            driver.find_element(By.ID, "save-activate").click()
            wait_for(
                driver,
                "return document.body.innerText.includes('Saved and activated kv-default v2')",
                timeout_s=10,
                what="the save confirmation",
            )
            v2 = PolicyVersion.objects.get(policy__name="kv-default", number=2)
            assert v2.params["cache_weight"] == 2.5
            assert driver.save_screenshot(str(tmp_path / "policy.png"))

            # A value outside the schema's range is refused, naming the field, in the page.
            field = driver.find_element(By.ID, "id_param__cache_weight")
            field.clear()
            field.send_keys("-3")
            driver.execute_script("document.getElementById('weights-form').noValidate = true")
            driver.find_element(By.ID, "save-version").click()
            wait_for(
                driver,
                "return document.getElementById('error-cache_weight') !== null",
                timeout_s=10,
                what="the field error",
            )
            assert not PolicyVersion.objects.filter(number=3).exists()

            # What-if: the recorded requests (with their block keys) replayed offline.
            values = driver.find_element(By.NAME, "values")
            values.clear()
            values.send_keys("0, 2")
            Select(driver.find_element(By.NAME, "param2")).select_by_value("load_weight")
            values2 = driver.find_element(By.NAME, "values2")
            values2.clear()
            values2.send_keys("0, 1")
            Select(driver.find_element(By.NAME, "profile")).select_by_value("dev")
            driver.find_element(By.XPATH, "//button[text()='Run offline sweep']").click()
            wait_for(
                driver,
                "const d = document.getElementById('whatif-chart').data;"
                "return d && d.length === 2 && d[0].type === 'heatmap' && d[0].z.length === 2",
                timeout_s=60,
                what="the what-if chart",
            )
            assert "replayed" in driver.find_element(By.ID, "whatif-status").text
            driver.execute_script("document.getElementById('whatif').scrollIntoView()")
            driver.save_screenshot(str(tmp_path / "whatif.png"))

            # A/B: v1 against v2, split per request; traffic flows into both arms.
            v1 = PolicyVersion.objects.get(policy__name="kv-default", number=1)
            driver.get(url + "/experiments/")
            driver.find_element(By.ID, "id_name").send_keys("w1-vs-w25")
            Select(driver.find_element(By.ID, "id_sticky")).select_by_value("request")
            Select(driver.find_element(By.NAME, "arm_A_version")).select_by_value(str(v1.pk))
            Select(driver.find_element(By.NAME, "arm_B_version")).select_by_value(str(v2.pk))
            driver.find_element(By.CSS_SELECTOR, "#experiment-form button[type=submit]").click()
            wait_for(
                driver,
                "return location.pathname === '/experiments/w1-vs-w25/'",
                timeout_s=10,
                what="the new experiment's page",
            )
            driver.find_element(By.XPATH, "//button[text()='Start']").click()
            wait_for(
                driver,
                "return document.body.innerText.includes('is running')",
                timeout_s=10,
                what="the experiment to start",
            )
            deadline = time.monotonic() + 30
            arms: set[str] = set()
            while time.monotonic() < deadline and len(arms) < 2:
                arms = set(
                    RequestRecord.objects.filter(arm__in=["A", "B"]).values_list("arm", flat=True)
                )
                time.sleep(0.5)
            assert arms == {"A", "B"}, f"traffic reached arms {arms}"
            time.sleep(3)
            driver.find_element(By.XPATH, "//button[text()='Recompute results']").click()
            wait_for(
                driver,
                "return document.getElementById('verdict') && document.getElementById('chart-cdf')"
                " && document.getElementById('chart-cdf').data",
                timeout_s=15,
                what="the experiment results",
            )
            driver.save_screenshot(str(tmp_path / "experiment.png"))
            driver.get(url + "/experiments/")
            assert "w1-vs-w25" in driver.find_element(By.TAG_NAME, "table").text
            driver.save_screenshot(str(tmp_path / "experiments.png"))
            assert not traffic.errors, traffic.errors[:3]
            assert traffic.sent > 20
    finally:
        driver.quit()

    for shot in ("overview", "policy", "workers", "experiment"):
        assert_non_trivial_png(tmp_path / f"{shot}.png")
    keep = os.environ.get("KVROUTE_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        for shot in tmp_path.glob("*.png"):
            shutil.copy(shot, Path(keep) / shot.name)
