"""``gpufleet diagnose`` against a scripted loopback API, and its HTML report in headless Chromium.

The browser test needs no stack: it writes the report of a fixed attribution to tmp_path and opens it by
``file://`` in the distribution's Chromium (``/usr/bin/chromium``, driven by Playwright, which never downloads a
browser); without either it skips and says which is missing.
"""

from __future__ import annotations

import json
import os
from urllib.parse import parse_qs, urlsplit

import pytest
from sdk_loopback import ACCESS_KEY, REGION, SECRET_KEY

from gpufleet.cli.main import main
from gpufleet.diagnose.attribution import Booking, Inputs, NodeInventory, PendingInterval, attribute
from gpufleet.diagnose.report import html_page
from gpufleet.profile import Profile, write_profile

CHROMIUM = os.environ.get("GPUFLEET_CHROMIUM", "/usr/bin/chromium")
T0 = 1_800_000_000.0


def fixed() -> Inputs:
    """Two nodes, three GPUs: a cold-cache attempt, a running one, a 3-GPU job waiting on a fragmented pool."""
    marks = {"dispatched": T0 + 1, "started": T0 + 3, "inputs_staged": T0 + 6, "model_loaded": T0 + 30,
             "first_step": T0 + 31, "generation_done": T0 + 38}
    return Inputs(T0, T0 + 60, (NodeInventory("node-a", "onprem-a", 2), NodeInventory("node-b", "onprem-a", 1)),
                  (Booking.with_marks(marks, job_id="job_1", epoch=1, node_id="node-a", gpus=(0,), start=T0,
                                      end=T0 + 40),
                   Booking("job_2", 1, "node-b", (0,), T0 + 50, None)),
                  (PendingInterval("job_3", T0 + 42, T0 + 47, 3, ("onprem-a",), "no room"),))


@pytest.fixture
def profile_file(loopback, tmp_path, monkeypatch):
    monkeypatch.delenv("GPUFLEET_ENDPOINT", raising=False)
    path = write_profile(Profile(endpoint=loopback.endpoint, region=REGION, access_key_id=ACCESS_KEY,
                                 secret_access_key=SECRET_KEY), tmp_path / "profile.json")
    monkeypatch.setenv("GPUFLEET_PROFILE", str(path))
    return path


def test_diagnose_prints_the_ranked_table_and_writes_the_page(loopback, profile_file, tmp_path, capsys):
    doc = {**attribute(fixed()).as_dict(lanes=True), "truncated": False}
    queries = []

    def handler(seen):
        queries.append((urlsplit(seen.path).path, parse_qs(urlsplit(seen.path).query)))
        return 200, {}, doc

    loopback.handler = handler
    page = tmp_path / "out" / "report.html"
    assert main(["diagnose", "--pool", "onprem-a", "--since", "30m", "--html", str(page)]) == 0
    out = capsys.readouterr().out.splitlines()
    path, q = queries[0]
    assert path == "/v1/admin/diagnose" and q["pool"] == ["onprem-a"] and q["lanes"] == ["true"]
    assert q["since"][0].endswith("Z")
    assert out[2].split()[:2] == ["CAUSE", "GPU_HOURS"] and out[3].split()[0] == "model_load"
    assert 'id="timeline"' in page.read_text()
    assert main(["diagnose", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert "lanes" not in got and got["causes"][0]["cause"] == "model_load" and "lanes" not in queries[1][1]
    assert main(["diagnose", "--since", "yesterday"]) == 1


def test_the_report_renders_in_headless_chromium(tmp_path):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -c constraints.txt -e '.[dev]')")
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.skip(f"no Chromium at {CHROMIUM} (make tools installs the distribution's package)")
    page_file = tmp_path / "report.html"
    page_file.write_text(html_page(attribute(fixed()), "fixed attribution"))
    with sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, chromium_sandbox=os.getuid() != 0)
        except Exception as err:  # the binary is there but cannot start (missing libraries, no /dev/shm ...)
            pytest.skip(f"Chromium at {CHROMIUM} cannot start here: {str(err).splitlines()[0]}")
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_file.as_uri())
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
            # the timeline: one lane label per GPU, segments with a drawn size; the chart: one bar per cause
            sizes = page.eval_on_selector_all(
                "#timeline rect.seg", "els => els.map(e => { const b = e.getBBox(); return [b.width, b.height]; })")
            bars = page.eval_on_selector_all("#chart rect.bar", "els => els.map(e => e.getBBox().width)")
            box = page.eval_on_selector("#timeline", "e => { const r = e.getBoundingClientRect(); return [r.width, r.height]; }")
            legend = page.inner_text(".legend")
        finally:
            browser.close()
    assert errors == []
    assert requests == [page_file.as_uri()]  # self-contained: nothing else fetched
    assert shot.stat().st_size > 5000
    assert len(sizes) >= 3 and all(w > 0 and h > 0 for w, h in sizes)
    assert box[0] > 500 and box[1] > 40
    assert len(bars) == len(attribute(fixed()).table()) and all(w > 0 for w in bars)
    assert "M model_load" in legend and "hatched" in legend  # readable without colour
