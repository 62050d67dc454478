"""The operator's dashboard at `/` in a real headless Chromium, against a real gateway and
simulated agents on loopback: what it shows is what the API says, events appear within one
update, cancelling needs the API token and a confirmation, bad input changes nothing.

Chromium and chromedriver are Debian packages (`scripts/ci-chromium.sh` installs them); without
them these tests skip, unless FLEXGATE_REQUIRE_CHROMIUM=1 (CI), where they fail.
"""

from __future__ import annotations

import os
import shutil
import time
from datetime import UTC, datetime

import httpx
import pytest

from gateway.store.db import Store
from tests.conftest import wait_for
from tests.gateway.conftest import API, running_site
from tests.gateway.test_meter_history import running_gateway
from tests.gateway.test_settlement import HOLIDAY, site_database, write_site

READ_TOKEN = "read-token-0123456789abcdef"
#: The page polls site and events every 2 s: one update, and the page's own load, fit in this.
ONE_UPDATE_S = 6.0


def _chromium_missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is not installed (pip install -e '.[test]')"
    for program in ("chromium", "chromedriver"):
        if shutil.which(program) is None:
            return f"{program} is not on PATH (scripts/ci-chromium.sh installs it)"
    return None


@pytest.fixture
def browser():
    missing = _chromium_missing()
    if missing:
        if os.environ.get("FLEXGATE_REQUIRE_CHROMIUM") == "1":
            pytest.fail(f"FLEXGATE_REQUIRE_CHROMIUM=1 but {missing}")
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or ""
    for argument in (
        "--headless=new",
        "--no-sandbox",  # as root (CI containers)
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,2400",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver) -> list[str]:
    """The browser console's errors since the last call."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def text(driver, element_id: str) -> str:
    return driver.find_element("id", element_id).text


def shown(driver, element_id: str, what: str, seconds: float = ONE_UPDATE_S) -> str:
    """The element's text once the page has filled it in (not the placeholder)."""
    return wait_for(
        lambda: (value := text(driver, element_id)) not in ("", "–") and value,
        what,
        seconds,
        every_s=0.1,
    )


def event_row(driver, event_id: str):
    rows = driver.find_elements("css selector", f'#events-rows tr[data-event-id="{event_id}"]')
    return rows[0] if rows else None


def updates(driver) -> int:
    """How many times the page has read the site and the events since it loaded."""
    return int(driver.execute_script("return document.body.dataset.updates || '0'"))


def css_text(driver, selector: str) -> str | None:
    """The text of the first element matching `selector`, None without one; read in one
    script, so a table redrawn meanwhile cannot leave a stale element behind."""
    script = "const e = document.querySelector(arguments[0]); return e ? e.textContent : null"
    return driver.execute_script(script, selector)


def row_status(driver, event_id: str) -> str | None:
    return css_text(driver, f'#events-rows tr[data-event-id="{event_id}"] td.status')


def create_event(api: httpx.Client, reduction_kw: float = 5.0, duration_s: float = 300) -> dict:
    body = {
        "reduction_kw": reduction_kw,
        "start": datetime.now(UTC).isoformat(),
        "duration_s": duration_s,
    }
    answer = api.post("/v1/events", json=body, headers=API)
    assert answer.status_code == 201, answer.text
    return answer.json()


def use_token(driver, token: str) -> None:
    driver.find_element("id", "token").send_keys(token)
    driver.find_element("css selector", "#token-form button[type=submit]").click()


def accept_confirmation(driver, accept: bool = True) -> str:
    from selenium.webdriver.support.ui import WebDriverWait

    alert = WebDriverWait(driver, 5).until(lambda d: d.switch_to.alert)
    question = alert.text
    if accept:
        alert.accept()
    else:
        alert.dismiss()
    return question


def test_the_page_and_its_assets_are_served_locally(tmp_path):
    with running_site(tmp_path, f"sqlite:///{tmp_path / 'gateway.db'}") as site:
        page = site.api.get("/", headers={"Accept": "text/html"})
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        for asset, kind in (
            ("dashboard.js", "text/javascript"),
            ("settlement.js", "text/javascript"),
            ("fast.js", "text/javascript"),
            ("dashboard.css", "text/css"),
        ):
            assert f"/dashboard/{asset}" in page.text
            answer = site.api.get(f"/dashboard/{asset}")
            assert answer.status_code == 200
            assert answer.headers["content-type"].startswith(kind)
        assert "http://" not in page.text
        assert page.headers["content-security-policy"].startswith("default-src 'self'")
        assert "https://" not in page.text  # no CDN: everything comes from the gateway
        missing = site.api.get("/dashboard/secrets.env")
        assert missing.status_code == 404
        assert "no dashboard asset 'secrets.env'" in missing.json()["detail"]
        assert site.api.get("/dashboard/..%2Fsettings.py").status_code == 404


@pytest.mark.timeout(120)
def test_the_page_shows_what_the_api_says_without_console_errors(tmp_path, browser):
    with running_site(tmp_path, f"sqlite:///{tmp_path / 'gateway.db'}") as site:
        event = create_event(site.api)
        site.event_caps(event["id"])  # the caps set: the power readings settle
        # The meter swings with the jobs' iterations: what the page shows is a reading the API
        # gave while the page was open.
        readings = [site.api.get("/v1/site").json()["meter"]["facility_power_kw"]]
        browser.get(str(site.api.base_url))
        api = site.api.get("/v1/site").json()
        readings.append(api["meter"]["facility_power_kw"])
        assert (
            shown(browser, "site-baseline-kw", "the baseline")
            == f"{api['baseline_facility_kw']:.1f}"
        )
        seen = set()
        deadline = time.monotonic() + 3 * ONE_UPDATE_S / 2
        while time.monotonic() < deadline:
            readings.append(site.api.get("/v1/site").json()["meter"]["facility_power_kw"])
            seen.add(text(browser, "site-meter-kw"))
            time.sleep(0.1)
        seen.discard("–")
        assert len(seen) >= 2, "the meter did not update"
        for value in seen:
            assert min(readings) - 0.05 <= float(value) <= max(readings) + 0.05, (
                value,
                seen,
                readings,
            )
        assert event["id"] in shown(browser, "active-event", "the active event")
        assert "from manual" in text(browser, "active-event")

        jobs = site.api.get("/v1/jobs").json()["jobs"]
        wait_for(
            lambda: len(browser.find_elements("css selector", "#jobs-rows tr")) == len(jobs),
            "the jobs table",
            ONE_UPDATE_S * 3,
        )
        plan_id = wait_for(
            lambda: site.api.get(f"/v1/events/{event['id']}").json()["plan_id"], "a plan"
        )
        plan = site.api.get(f"/v1/plans/{plan_id}").json()
        caps = {j["id"]: j["cap_w"] for j in plan["jobs"]}

        in_force = {p["id"]: p for p in site.api.get("/v1/jobs").json()["pfi"]}
        for job in jobs:
            row = f'#jobs-rows tr[data-job-id="{job["id"]}"]'
            wait_for(
                lambda row=row, job=job: (
                    css_text(browser, f"{row} td.cap") == f"{caps[job['id']]:.1f}"
                ),
                f"{job['id']}'s cap",
                ONE_UPDATE_S * 3,
            )
            assert css_text(browser, f"{row} td.pfi") == f"{job['pfi']:.2f}"
            assert css_text(browser, f"{row} td.pfi-source") == in_force[job["id"]]["source"]

        # Sortable: a heading sorts by its column, a second click reverses.
        def job_order() -> list[str]:
            script = (
                "return [...document.querySelectorAll('#jobs-rows tr')].map(r => r.dataset.jobId)"
            )
            return browser.execute_script(script)

        by_pfi = [j["id"] for j in sorted(jobs, key=lambda j: j["pfi"])]
        browser.find_element("css selector", '#jobs th[data-key="pfi"]').click()
        assert job_order() == by_pfi
        browser.find_element("css selector", '#jobs th[data-key="pfi"]').click()
        assert job_order() == by_pfi[::-1]

        # Per GPU: the cap sent and the limit the agent read back (the plan's `enforced`).
        assert any(command["caps"] for command in plan["commands"])
        for command in plan["commands"]:
            enforced = {e["gpu"]: e["enforced_w"] for e in command["enforced"]}
            limits = site.limits()[command["node"]]
            gpus = css_text(browser, f'#nodes-rows tr[data-node="{command["node"]}"] td.gpus')
            for cap in command["caps"]:
                assert enforced[cap["gpu"]] == pytest.approx(limits[cap["gpu"]])
                assert f" / {cap['cap_w']:.0f} / {enforced[cap['gpu']]:.0f}" in gpus, gpus

        nodes = site.api.get("/v1/nodes").json()["nodes"]
        for node in nodes:
            assert (
                css_text(browser, f'#nodes-rows tr[data-node="{node["node"]}"] td.reachable')
                == "yes"
            )
        sync = site.api.get("/v1/sync").json()
        assert text(browser, "sync-verdict") == sync["verdict"]
        for loop in sync["loops"]:
            row = f'#loops-rows tr[data-loop="{loop["name"]}"]'
            # A measured delay moves between the page's read and this one (each re-plan's
            # dispatch is measured anew): they agree to within a loaded machine's jitter.
            shown_s = float(css_text(browser, f"{row} td.delay"))
            assert shown_s == pytest.approx(loop["delay_s"], abs=0.5)
            assert css_text(browser, f"{row} td.verdict") == loop["verdict"]
        oscillation = sync["oscillation"]
        assert text(browser, "osc-alarm") == ("alarm" if oscillation["alarm"] else "ok")
        for source in ("meter", "agents"):
            # Each source shows its RMS or, out of its reach, why (the agents' traces fill up
            # between the page's read and this one: either may show).
            row = f'#osc-rows tr[data-source="{source}"]'
            rms, why = css_text(browser, f"{row} td.rms"), css_text(browser, f"{row} td.reason")
            assert (rms is None) != (why is None), (source, rms, why)
            assert rms is None or float(rms) >= 0.0
        assert "no meter" in css_text(browser, '#osc-rows tr[data-source="meter"] td.reason')

        quote = site.api.post("/v1/quotes", json={}).json()
        assert shown(browser, "flex-expected-kw", "the quote") == f"{quote['achievable_kw']:.1f}"
        assert text(browser, "flex-firm-kw") == f"{quote['firm_kw']:.1f}"
        assert browser.find_elements("css selector", "#supply-chart path.series")
        assert browser.find_elements("css selector", "#power-chart path.series.meter")
        assert console_errors(browser) == []


def test_a_fresh_page_contradicts_itself_nowhere(tmp_path, browser):
    """No "recovering from null", no "-0.0 kW", the order parameters and the verdict each
    explained, nodes' backends shown, the supply curve's axes with units, an event's opt and
    reason in view."""
    with running_site(tmp_path, f"sqlite:///{tmp_path / 'gateway.db'}") as site:
        browser.get(str(site.api.base_url))
        active = shown(browser, "active-event", "the active event")
        assert "null" not in active, active
        nodes = site.api.get("/v1/nodes").json()["nodes"]
        for node in nodes:
            cell = f'#nodes-rows tr[data-node="{node["node"]}"] td.backend'
            wait_for(lambda cell=cell: css_text(browser, cell), "the backend", ONE_UPDATE_S * 3)
            assert css_text(browser, cell) == "sim (simulated GPUs)"
        verdict = shown(browser, "sync-verdict", "the sync verdict")
        assert text(browser, "sync-verdict-note").startswith(verdict.replace("-", " "))
        assert text(browser, "sync-order-note") != "–"
        for couples in browser.find_elements("css selector", "#loops-rows td.couples"):
            assert couples.text != "yes" or verdict != "safe", couples.text
        wait_for(
            lambda: browser.find_elements("css selector", "#supply-chart path.series"),
            "the supply curve",
            ONE_UPDATE_S * 3,
        )
        ticks = [t.text for t in browser.find_elements("css selector", "#supply-chart text.end")]
        assert ticks
        assert all(t.endswith(" %") for t in ticks), ticks
        assert "-0.0" not in browser.find_element("tag name", "body").text
        # A shed of -0.04 kW (noise around no shed) reads 0.0, not -0.0 as if load were added.
        assert browser.execute_script("return num(-0.04)") == "0.0"

        body = {"reduction_kw": 3000.0, "start": datetime.now(UTC).isoformat()}
        event = site.api.post(
            "/v1/events", json=body | {"duration_s": 300, "force": True}, headers=API
        ).json()
        reason = f'#events-rows tr[data-event-id="{event["id"]}"] td.reason'
        wait_for(lambda: css_text(browser, reason), "the event's reason", ONE_UPDATE_S * 3)
        inside = (
            "const r = document.querySelector(arguments[0]).getBoundingClientRect();"
            "const s = document.getElementById('events').getBoundingClientRect();"
            "return r.right <= s.right + 1"
        )
        assert browser.execute_script(inside, reason), "the reason is behind the scrollbar"
        assert console_errors(browser) == []


@pytest.mark.timeout(120)
def test_an_event_appears_and_cancelling_needs_the_token_and_a_confirmation(tmp_path, browser):
    with running_site(tmp_path, f"sqlite:///{tmp_path / 'gateway.db'}") as site:
        browser.get(str(site.api.base_url))
        shown(browser, "site-baseline-kw", "the page's first update")
        before = updates(browser)
        event = create_event(site.api)
        # The update under way may have read the events before; the next began after.
        wait_for(lambda: updates(browser) >= before + 2, "the next update", ONE_UPDATE_S * 2)
        assert row_status(browser, event["id"]) in ("pending", "active")

        def status() -> str:
            return site.api.get(f"/v1/events/{event['id']}").json()["status"]

        def click_cancel() -> None:
            wait_for(lambda: row_status(browser, event["id"]), "the event's row", ONE_UPDATE_S)
            event_row(browser, event["id"]).find_element("css selector", "button.cancel").click()

        # Asked to confirm, and dismissed: nothing happens.
        click_cancel()
        assert event["id"] in accept_confirmation(browser, accept=False)
        assert status() in ("pending", "active")

        # Without a token the gateway refuses, and the page says so.
        click_cancel()
        accept_confirmation(browser)
        refusal = shown(browser, "error", "the refusal")
        assert "401" in refusal
        assert "FLEXGATE_API_TOKEN" in refusal
        assert status() in ("pending", "active")

        def delivered_cell():
            return event_row(browser, event["id"]).find_element("css selector", "td.delivered")

        def kept() -> dict | None:
            return site.api.get(f"/v1/events/{event['id']}").json()["delivery"]

        # The site loop adds a sample to the event's delivery every meter period (5 s).
        wait_for(lambda: kept() is not None, "the event's first delivery sample", 15)

        # With the API token, confirmed: cancelled, on the gateway and on the page.
        use_token(browser, API["Authorization"].removeprefix("Bearer "))
        click_cancel()
        accept_confirmation(browser)
        wait_for(lambda: status() == "cancelled", "the cancellation", ONE_UPDATE_S)
        wait_for(
            lambda: row_status(browser, event["id"]) == "cancelled",
            "the cancelled row",
            ONE_UPDATE_S,
        )
        assert not browser.find_element("id", "error").is_displayed()
        # Ended, the event shows what the gateway kept of its delivery, not a live reading.
        wait_for(
            lambda: delivered_cell().text == f"{kept()['delivered_kw']:.1f}",
            "the stored delivery",
            ONE_UPDATE_S,
        )
        assert kept()["meter_source"] in delivered_cell().get_attribute("title")
        # The token is kept for this tab only.
        assert browser.execute_script("return window.localStorage.length") == 0
        assert browser.get_cookies() == []


@pytest.mark.timeout(120)
def test_a_bad_form_value_shows_the_apis_error_and_changes_nothing(tmp_path, browser):
    with running_site(tmp_path, f"sqlite:///{tmp_path / 'gateway.db'}") as site:
        browser.get(str(site.api.base_url))
        shown(browser, "site-baseline-kw", "the page's first update")
        use_token(browser, API["Authorization"].removeprefix("Bearer "))
        reduction = browser.find_element("id", "event-reduction-kw")
        reduction.clear()
        reduction.send_keys("-5")
        browser.find_element("css selector", "#event-form button[type=submit]").click()
        accept_confirmation(browser)
        error = shown(browser, "error", "the API's error")
        assert "body.reduction_kw: Input should be greater than 0" in error
        assert site.api.get("/v1/events").json()["events"] == []

        window = browser.find_element("id", "quote-window-s")
        window.clear()
        window.send_keys("0")
        browser.find_element("css selector", "#quote-form button[type=submit]").click()
        wait_for(
            lambda: "The quote was refused" in text(browser, "error"),
            "the quote's error",
            ONE_UPDATE_S,
        )
        assert "window_s" in text(browser, "error")
        assert text(browser, "quote-result") == ""

        window.clear()
        window.send_keys("1800")
        browser.find_element("css selector", "#quote-form button[type=submit]").click()
        asked = {"reduction_kw": 10, "window_s": 1800}
        quote = site.api.post("/v1/quotes", json=asked).json()
        answer = f"costs {quote['requested_throughput_loss']:.0f} throughput"
        wait_for(lambda: answer in text(browser, "quote-result"), "the quote", ONE_UPDATE_S)
        assert "10 kW for 1800 s: feasible" in text(browser, "quote-result")
        assert text(browser, "flex-window-s") == "1800"

        # A good value goes through, and the page says what came back.
        reduction.clear()
        reduction.send_keys("4")
        browser.find_element("css selector", "#event-form button[type=submit]").click()
        assert "4 kW" in accept_confirmation(browser)
        created = shown(browser, "event-form-result", "the created event")
        events = site.api.get("/v1/events").json()["events"]
        assert len(events) == 1
        assert events[0]["reduction_kw"] == 4.0
        assert events[0]["id"] in created


@pytest.mark.timeout(120)
def test_the_page_works_with_a_read_token(tmp_path, browser):
    with running_site(
        tmp_path, f"sqlite:///{tmp_path / 'gateway.db'}", read_token=READ_TOKEN
    ) as site:
        assert site.api.get("/v1/site").status_code == 401
        browser.get(str(site.api.base_url))
        refusal = shown(browser, "error", "the refusal")
        assert "401" in refusal
        assert "FLEXGATE_READ_TOKEN" in refusal
        assert text(browser, "site-baseline-kw") == "–"  # shows nothing it may not read
        console_errors(browser)  # the 401s above; none after the token

        use_token(browser, READ_TOKEN)
        reader = {"Authorization": f"Bearer {READ_TOKEN}"}
        api = site.api.get("/v1/site", headers=reader).json()
        assert (
            shown(browser, "site-baseline-kw", "the baseline")
            == f"{api['baseline_facility_kw']:.1f}"
        )
        wait_for(
            lambda: not browser.find_element("id", "error").is_displayed(),
            "the error gone",
            ONE_UPDATE_S,
        )
        assert (
            browser.execute_script("return sessionStorage.getItem('flexgate.token')") == READ_TOKEN
        )
        assert browser.execute_script("return window.localStorage.length") == 0
        # A new page in the same tab keeps the session's token: it reads at once.
        browser.refresh()
        shown(browser, "site-baseline-kw", "the baseline after a reload")
        assert console_errors(browser) == []


def settle_on_page(driver, event_id: str, rules: str = "") -> None:
    """Choose the event in the settlement view (once the page lists it) and ask."""
    from selenium.webdriver.support.ui import Select

    option = f'#settlement-event option[value="{event_id}"]'
    wait_for(lambda: css_text(driver, option), f"{event_id} in the settlement view", ONE_UPDATE_S)
    Select(driver.find_element("id", "settlement-event")).select_by_value(event_id)
    field = driver.find_element("id", "settlement-rules")
    field.clear()
    field.send_keys(rules)
    driver.find_element("css selector", "#settlement-form button[type=submit]").click()


def settled_rows(driver, rule: str) -> list[list[str]]:
    """The interval table of `rule` as the page shows it, once shown."""
    script = (
        "return [...document.querySelectorAll(arguments[0])]"
        ".map(r => [...r.children].map(c => c.textContent))"
    )
    selector = f'#settlement-view .rule[data-rule="{rule}"] table.intervals tbody tr'
    return wait_for(lambda: driver.execute_script(script, selector), f"{rule}'s intervals", 10)


@pytest.mark.timeout(120)
def test_the_settlement_view_shows_each_rule_as_worked_out_by_hand(tmp_path, browser):
    """tests/gateway/test_settlement.py's site: ev-1 (14:00-15:00 UTC, 35 kW asked) read 70,
    70, 80, 70 kW against a 110 kW baseline under both rules; 14:15 estimated, 14:30 estimated
    and taken while the meter faulted, and short of the target. ev-0's 10of10 adjustment (x5)
    is capped at +20%: 120 kW against 500 metered."""
    database_url = site_database(tmp_path)
    with running_gateway(tmp_path, database_url, settlement_holidays=HOLIDAY.isoformat()) as (
        api,
        _,
    ):
        browser.get(str(api.base_url))
        settle_on_page(browser, "ev-1")
        for rule in ("10of10", "sameday-3+2"):
            assert settled_rows(browser, rule) == [
                ["14:00–14:15", "110.0", "70.0", "35.0", "40.0", "10.00", "yes", ""],
                ["14:15–14:30", "110.0", "70.0", "35.0", "40.0", "10.00", "yes", "estimated"],
                [
                    "14:30–14:45",
                    "110.0",
                    "80.0",
                    "35.0",
                    "30.0",
                    "7.50",
                    "no (5.00 kW short)",
                    "estimated, meter fault",
                ],
                ["14:45–15:00", "110.0", "70.0", "35.0", "40.0", "10.00", "yes", ""],
            ]
            block = f'#settlement-view .rule[data-rule="{rule}"]'
            assert css_text(browser, f"{block} dd.delivered-kwh") == "37.5 kWh"
            assert css_text(browser, f"{block} dd.target-kwh") == "35.0 kWh"
            assert css_text(browser, f"{block} dd.compliance") == "75 % (3 of 4 intervals met)"
            assert css_text(browser, f"{block} dd.estimated") == "14:15, 14:30"
            assert css_text(browser, f"{block} dd.fault") == "14:30"
            chart = f"{block} svg.settlement-chart"
            for series in ("meter", "baseline", "target"):
                assert browser.find_elements("css selector", f"{chart} path.series.{series}")
            assert len(browser.find_elements("css selector", f"{chart} .band.unmet rect")) == 1
            assert len(browser.find_elements("css selector", f"{chart} .band.estimated rect")) == 2
        assert css_text(browser, '.rule[data-rule="10of10"] dd.baseline') == (
            "10 days, day-of adjustment ×1.100"
        )
        assert "UTC" in text(browser, "settlement-note")

        settle_on_page(browser, "ev-0", rules="10of10")
        wait_for(
            lambda: (
                "(capped)" in (css_text(browser, ".rule[data-rule='10of10'] dd.baseline") or "")
            ),
            "ev-0's capped baseline",
            10,
        )
        assert settled_rows(browser, "10of10")[0][1:5] == ["120.0", "500.0", "20.0", "-380.0"]
        assert css_text(browser, "#settlement-view .rule[data-rule='sameday-3+2']") is None

        # A rule the gateway does not know: its refusal, naming it, and no figures left over.
        settle_on_page(browser, "ev-1", rules="9of9")
        refusal = shown(browser, "settlement-error", "the refusal")
        assert "Settling ev-1 was refused: 422: rules: preset '9of9'" in refusal, refusal
        assert browser.find_elements("css selector", "#settlement-view .rule") == []
        errors = console_errors(browser)  # the browser logs the refused read itself
        assert all("422" in e for e in errors), errors

        # The events table's button settles its event under the site's rules.
        browser.find_element("id", "settlement-rules").clear()
        event_row(browser, "ev-1").find_element("css selector", "button.settle").click()
        assert settled_rows(browser, "sameday-3+2")[2][5:] == [
            "7.50",
            "no (5.00 kW short)",
            "estimated, meter fault",
        ]
        assert not browser.find_element("id", "settlement-error").is_displayed()


@pytest.mark.timeout(120)
def test_a_rule_without_a_baseline_shows_its_reason_and_the_other_rule_settles(tmp_path, browser):
    """Six days of history: 10of10 finds three eligible days of the ten it needs
    (tests/gateway/test_settlement.py); the same-day rule settles as worked out by hand."""
    database_url = f"sqlite:///{tmp_path / 'gateway.db'}"
    store = Store(database_url)
    try:
        write_site(store, history_days=6)
    finally:
        store.close()
    with running_gateway(tmp_path, database_url, settlement_holidays=HOLIDAY.isoformat()) as (
        api,
        _,
    ):
        browser.get(str(api.base_url))
        settle_on_page(browser, "ev-1")
        assert [row[1:5] for row in settled_rows(browser, "10of10")] == [
            ["–", "70.0", "35.0", "–"],
            ["–", "70.0", "35.0", "–"],
            ["–", "80.0", "35.0", "–"],
            ["–", "70.0", "35.0", "–"],
        ]
        ten = '#settlement-view .rule[data-rule="10of10"]'
        assert css_text(browser, f"{ten} p.reason").startswith(
            "No baseline: 3 eligible days, 10 needed"
        )
        assert css_text(browser, f"{ten} dd.compliance") == "0 % (0 of 4 intervals met)"
        assert css_text(browser, f"{ten} dd.unsettled") == "14:00, 14:15, 14:30, 14:45"
        same = '#settlement-view .rule[data-rule="sameday-3+2"]'
        assert css_text(browser, f"{same} dd.compliance") == "75 % (3 of 4 intervals met)"
        assert css_text(browser, f"{same} p.reason") is None
        assert console_errors(browser) == []


@pytest.mark.timeout(120)
def test_the_fast_path_shows_its_armed_depths_the_frequency_feed_and_its_events(tmp_path, browser):
    """A site arming 10-40 % with a frequency feed (Modbus, `test_frequency`): the page shows
    each armed depth as `GET /v1/fast/armed` gives it, the feed's reading; a dip fires the
    fast path and the page lists the fast event with its depth and the time from its trigger
    to the agents' caps enforced; a deeper trigger on the API deepens the same event."""
    from tests.gateway.test_fast import fast_site
    from tests.gateway.test_frequency import FEED, grid, registers

    with grid(50.0) as (where, holding):
        url = f"modbus://{where}?register=0&type=float32"
        with fast_site(tmp_path, memory=True, frequency_url=url, **FEED) as site:
            armed = site.api.get("/v1/fast/armed").json()
            browser.get(str(site.api.base_url))
            assert shown(browser, "fast-state", "the fast path's state") == "armed"
            for depth in armed["depths_pct"]:
                row = f'#fast-depths-rows tr[data-depth="{depth:g}"]'
                key = f"{depth:g}"
                assert css_text(browser, f"{row} td.kw") == (
                    f"{armed['expected_reduction_kw'][key]:.1f}"
                )
                assert css_text(browser, f"{row} td.nodes") == str(armed["armed_nodes"][key])
            assert text(browser, "fast-generation") == str(armed["generation"])
            assert shown(browser, "freq-hz", "the frequency") == "50.000"
            assert text(browser, "freq-fault") == "none"

            holding[:] = registers(49.62)  # below the 49.7 Hz threshold: 30 %
            [event] = site.wait(
                lambda: [
                    e for e in site.api.get("/v1/events").json()["events"] if e["source"] == "fast"
                ],
                what="the fast event",
            )
            row = f'#fast-events-rows tr[data-event-id="{event["id"]}"]'
            wait_for(
                lambda: css_text(browser, f"{row} td.latency") not in (None, "–"),
                "the fast event's trigger-to-enforced time",
                ONE_UPDATE_S,
            )
            [sent] = site.api.get("/v1/fast/triggers").json()["triggers"]
            assert css_text(browser, f"{row} td.latency") == f"{sent['enforced_s'] * 1000:.0f}"
            assert css_text(browser, f"{row} td.depths") == "30 %"
            assert text(browser, "fast-state") == "triggered"
            assert text(browser, "freq-depth") == "30 %"

            answer = site.api.post(
                "/v1/fast/trigger", json={"depth_pct": 40, "duration_s": 60}, headers=API
            )
            assert answer.json()["event_id"] == event["id"]  # a renewal, deeper
            wait_for(
                lambda: css_text(browser, f"{row} td.depths") == "30 % → 40 %",
                "the event deepened",
                ONE_UPDATE_S,
            )
            assert css_text(browser, f"{row} td.renewals") == "1"
            assert console_errors(browser) == []
