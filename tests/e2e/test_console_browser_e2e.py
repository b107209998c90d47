"""The web console in a real browser against the session's real stack (``gpufleet dev``'s console server).

Headless Chromium from the distribution's packages (``/usr/bin/chromium``, installed by ``make tools``) is
driven by Playwright for Python, which never downloads a browser; without either the tests skip and say so.
The page signs every ``/v1`` request itself with the developer's credentials the console server hands it.

- Submit a job from the form, watch its page reach SUCCEEDED, play its video (the ``<video>`` element
  decodes a frame: readyState >= 2, videoWidth > 0, a requestVideoFrameCallback while playing) and see
  the provenance the platform recorded (C2PA-signed, its watermark payload); find it in the jobs list by label.
- See a pending job's reason in the queue; cancel a running job from its page.
- Signed in with the operator's key: the fleet page (nodes, a timeline lane per GPU) and the admin pages
  (a tenant onboarded from the console, quotas, safety profiles, nodes, quarantined jobs).
- Every page: no console error, no uncaught exception, and axe-core (tests/e2e/browser, MPL-2.0, injected
  from the local file) finds no serious or critical violation. Screenshots go to a per-session folder,
  named in the test report (``user_properties``) and its captured output.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest
from stack_helpers import wait_for

from gpufleet.errors import InvalidTransition, NotFound
from gpufleet.sdk import Client

pytestmark = [pytest.mark.xdist_group("e2e-stack"), pytest.mark.slow]

CHROMIUM = os.environ.get("GPUFLEET_CHROMIUM", "/usr/bin/chromium")
AXE = Path(__file__).resolve().parent / "browser" / "node_modules" / "axe-core" / "axe.min.js"
JOB_TIMEOUT_MS = 150_000
#: the longest video job a spec may ask for (the most denoising steps): the queue's pending job
LONG = {"workload": {"kind": "video.generate", "prompt": "a lighthouse in fog", "frames": 9, "steps": 200},
        "pools": ["onprem-a"]}


def running_spec() -> dict:
    """The job cancelled from its page: it must still be RUNNING when the page (polled every 1.5 s) looks. A video
    job is not, reliably: on a warm worker even ``LONG`` can end within a second or two (CI once waited 150 s for a
    RUNNING the page never showed). So a container job that sleeps until it is cancelled where tenant containers
    run (the stack prepared the tools image), else ``LONG``."""
    from gpufleet.local import oci_image

    if oci_image.local_oci_unavailable():
        return LONG
    return {"workload": {"kind": "container", "image": oci_image.TOOLS_IMAGE,
                         "command": ["sh", "-c", "sleep 600; : console-e2e-running"]}, "pools": ["onprem-a"]}


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -c constraints.txt -e '.[dev]')")
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.skip(f"no Chromium at {CHROMIUM} (make tools installs the distribution's package)")
    if not AXE.is_file():
        pytest.skip(f"axe-core is not installed at {AXE} (make tools runs npm ci in tests/e2e/browser)")
    with sync_playwright() as pw:
        try:
            b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, chromium_sandbox=os.getuid() != 0)
        except Exception as err:  # the binary is there but cannot start (missing libraries, no /dev/shm ...)
            pytest.skip(f"Chromium at {CHROMIUM} cannot start here: {str(err).splitlines()[0]}")
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    return tmp_path_factory.mktemp("console-screenshots")


@pytest.fixture(scope="module")
def console_url(devstack):
    return json.loads((devstack["state"] / "stack.json").read_text())["console"]["url"]


class Console:
    """One browser page on the console, recording console errors and uncaught exceptions."""

    def __init__(self, browser, url: str, shots: Path, node) -> None:
        self.context = browser.new_context(viewport={"width": 1366, "height": 900})
        self.context.add_init_script(path=str(AXE))  # not page script: the console's CSP allows no inline code
        self.page = self.context.new_page()
        self.url, self.shots, self.node = url, shots, node
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        self.page.set_default_timeout(20_000)
        self.t0 = time.monotonic()

    def mark(self, phase: str) -> None:
        """Record when a phase ended (seconds since the page opened), in the test report."""
        self.record(f"phase:{phase}", round(time.monotonic() - self.t0, 1))

    def record(self, name: str, value: object) -> None:
        """A property of the test in the report (``user_properties``), and printed with the test's output."""
        self.node.user_properties.append((name, value))
        print(f"{name}: {value}")

    def go(self, route: str) -> None:
        self.page.goto(self.url + route)
        self.page.wait_for_selector("main h1")

    def check(self, name: str) -> None:
        """Screenshot, no console errors so far, no serious/critical axe violation on this page."""
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        self.record(f"screenshot:{name}", str(path))
        result = self.page.evaluate("() => axe.run(document, {resultTypes: ['violations']})")
        bad = [(v["id"], v["impact"], [n["target"] for n in v["nodes"]][:3]) for v in result["violations"]
               if v["impact"] in ("serious", "critical")]
        assert not bad, f"{name}: accessibility violations {bad}"
        assert not self.errors, f"{name}: {self.errors}"

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def console(browser, console_url, shots, request):
    c = Console(browser, console_url, shots, request.node)
    yield c
    c.close()


def test_console_submit_watch_play_queue_reason_and_cancel(console, devstack):
    """One walk through the console, so that its jobs run side by side (the suite's time budget): submit from
    the form; meanwhile see a pending job's reason in the queue and cancel a running job from its page;
    then the submitted job's success, video and provenance, and the jobs list filtered by its label."""
    page, client = console.page, Client()
    console.go("#/jobs")
    console.check("01-jobs")
    console.go("#/submit")
    tag = uuid.uuid4().hex[:8]
    page.get_by_label("Prompt").fill("a red fox running through snow")
    page.get_by_label("Frames").fill("5")
    page.get_by_label("Denoising steps").fill("2")
    page.get_by_label("Pool").select_option("onprem-a")
    page.get_by_label("Labels").fill(f"console-e2e={tag}")
    console.check("02-submit")
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url("**/#/jobs/job_*")
    job_id = page.url.rsplit("/", 1)[1]
    stuck = client.submit({**LONG, "pools": ["console-e2e-nowhere"]}).job_id  # no such pool: it waits, with why
    running = None
    try:
        console.go("#/queue")
        reason = page.locator(f'tr[data-job="{stuck}"] td.reason')
        reason.wait_for()
        # QUEUED (prompt check, outbox) then a scheduler pass: as long as any job's way to PENDING on a loaded host
        wait_for(lambda: "console-e2e-nowhere" in reason.inner_text(), JOB_TIMEOUT_MS / 1000, 0.3,
                 "the pending job's reason")
        assert "exists" in reason.inner_text()
        console.check("03-queue")
        console.mark("pending-reason-seen")

        running = client.submit(running_spec()).job_id
        console.go(f"#/jobs/{running}")
        page.wait_for_selector('.statusline [data-status="RUNNING"]', timeout=JOB_TIMEOUT_MS)
        page.get_by_role("button", name=f"Cancel job {running}").click()
        page.wait_for_selector('.statusline [data-status="CANCELLED"]', timeout=60_000)
        console.check("04-job-cancelled")
        console.mark("running-job-cancelled")

        console.go(f"#/jobs/{job_id}")
        page.wait_for_selector('.statusline [data-status="SUCCEEDED"]', timeout=JOB_TIMEOUT_MS)
        page.wait_for_selector("#provenance")
        console.mark("submitted-job-succeeded")
        decoded = page.evaluate("""async () => {
            const v = document.getElementById('player');
            if (v.readyState < 2) await new Promise((ok) => v.addEventListener('loadeddata', ok, {once: true}));
            const frame = new Promise((ok, fail) => {
                v.requestVideoFrameCallback((now, meta) => ok(meta));
                setTimeout(() => fail(new Error('no video frame presented in 10s')), 10000);
            });
            await v.play();
            const meta = await frame;
            return {ready: v.readyState, width: v.videoWidth, height: v.videoHeight, frameWidth: meta.width};
        }""")
        assert decoded["ready"] >= 2 and decoded["width"] > 0 and decoded["frameWidth"] == decoded["width"], decoded
        recorded = client.get(job_id).output or {}
        verdict = page.locator("#provenance").inner_text()
        assert "C2PA-signed" in verdict and recorded["watermark_payload"] in verdict, verdict
        assert page.locator("ol.timeline li").count() >= 3
        console.check("05-job-succeeded")

        console.go(f"#/jobs?label=console-e2e%3D{tag}&status=SUCCEEDED")
        page.wait_for_selector(f'tr[data-job="{job_id}"] [data-status="SUCCEEDED"]')
        assert page.locator("tbody tr[data-job]").count() == 1
        assert page.get_by_role("button", name=f"Retry job {job_id} as a new job").is_visible()
        console.check("06-jobs-filtered")
        console.mark("done")
    finally:  # leave the shared stack as found: every job ended and its GPUs released
        for jid in (j for j in (stuck, running) if j):
            try:
                client.cancel(jid)
            except InvalidTransition:  # it ended meanwhile
                pass
        for jid in (j for j in (job_id, stuck, running) if j):
            wait_for(lambda j=jid: client.get(j).status.is_terminal(), 120, 0.3, f"{jid} ended")


def test_console_fleet_and_admin_pages_for_an_operator(console, console_url, devstack):
    """The costs page (as the developer). Signed in with the stack's operator key (``profiles/operator.json``; the served credentials are the
    developer's, who sees no admin link): the fleet page shows the agents' nodes and a timeline lane per GPU
    (with its text table); the admin pages show a tenant onboarded from the console's own form, the quota
    nodes, the safety profiles, the registered nodes (one, registered for this, deregistered from the page after
    its confirmation) and the quarantine list. Each page passes axe."""
    page = console.page
    banner = devstack["log"].read_text(errors="replace")
    assert "web console" in banner and console_url.rstrip("/") in banner  # gpufleet dev's ready banner names it
    console.go("#/costs?by=pool")
    page.wait_for_selector("table.costs tfoot th")
    assert page.locator("nav li.admin-only").first.is_hidden()  # the developer is no operator
    console.check("07-costs")
    op = json.loads((devstack["state"] / "profiles" / "operator.json").read_text())
    console.go("#/signin")
    page.get_by_label("Access key id").fill(op["access_key_id"])
    page.get_by_label("Secret access key").fill(op["secret_access_key"])
    page.get_by_role("button", name="Sign in", exact=True).click()
    page.wait_for_url("**/#/fleet")
    page.wait_for_selector("table.nodes tr[data-node] [data-state]")
    page.wait_for_selector("ol.lanes li.lane .seg[data-cause]")
    assert page.locator("table.lane-shares tbody tr[data-lane]").count() == page.locator("ol.lanes li.lane").count()
    assert page.locator("nav li.admin-only").first.is_visible()
    console.check("08-fleet")
    console.mark("fleet-shown")

    tenant = f"console-{uuid.uuid4().hex[:8]}"
    console.go("#/admin/tenants")
    page.get_by_label("Tenant", exact=True).fill(tenant)
    page.get_by_role("button", name="Onboard").click()
    page.wait_for_selector(f'tr[data-tenant="{tenant}"]')
    console.check("09-admin-tenants")
    for section, title, row in (("quotas", "Quotas", "tr[data-quota]"),
                                ("safety", "Safety profiles", f'tr[data-tenant="{tenant}"]'),
                                ("nodes", "Nodes", "tr[data-node]"),
                                ("quarantine", "Quarantined jobs", "table.admin tbody tr")):
        console.go(f"#/admin/{section}")
        page.wait_for_selector(f'.view:has(h1:text-is("Administration: {title}")) {row}')
        console.check(f"10-admin-{section}")
    # a node registered only to be removed from the page (no agent runs it)
    gone = f"console-gone-{uuid.uuid4().hex[:6]}"
    operator = Client(profile=str(devstack["state"] / "profiles" / "operator.json"))
    operator.request("POST", "/v1/nodes", body={"node_id": gone, "pool": "onprem-a"})
    console.go("#/admin/nodes")
    asked: list[str] = []
    page.once("dialog", lambda d: asked.append(d.message) or d.accept())
    page.get_by_role("button", name=f"Deregister node {gone}").click()
    page.wait_for_selector(f'tr[data-node="{gone}"]', state="detached")
    assert asked and "refuses its calls" in asked[0]
    console.check("11-admin-node-deregistered")
    with pytest.raises(NotFound):  # gone from the API too
        operator.request("GET", f"/v1/admin/nodes/{gone}")
    console.mark("admin-shown")


def test_axe_core_is_pinned_with_its_licence():
    """axe-core comes from the committed lock file (make tools: npm ci), MPL-2.0."""
    lock = json.loads((AXE.parents[2] / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/axe-core"]["license"] == "MPL-2.0"
