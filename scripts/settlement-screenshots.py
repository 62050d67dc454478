"""Saves docs/img/settlement-report.png and docs/img/dashboard-settlement.png: a month's
settlement report and the dashboard's settlement view, from a `flexgate replay` of 30 days with
ten events.

    python scripts/settlement-screenshots.py [--out docs/img] [--event replay-05] [--replay DIR]

Runs the replay (about a minute; `--replay DIR` reuses the folder of an earlier
`flexgate replay --out DIR` with the defaults), serves its store with a gateway on loopback,
writes the month's report with `flexgate report` from it, and saves the whole report page and
the dashboard's settlement view of one event, both in headless Chromium. The PNGs are reduced
to a palette of 256 colours (a page of text and lines loses nothing to see). Needs chromium,
chromedriver and selenium (`scripts/ci-chromium.sh`, `pip install -e '.[test]'`).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import Select

from flexgate.cli import main as flexgate
from flexgate.replay import default_holiday
from flexgate.serve import ServerThread
from gateway.app import create_app
from gateway.settings import GatewaySettings

WIDTH = 1280  #: the browser's width: the report's table and plots fit in it
FIRST_DAY, DAYS = date(2026, 6, 1), 30


def browser() -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or ""
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--window-size={WIDTH},900",
    ):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))


def replay(folder: Path) -> None:
    """`flexgate replay`'s defaults, spelt out: 30 days from 2026-06-01 with ten events."""
    days = ["--start", FIRST_DAY.isoformat(), "--days", str(DAYS), "--events", "10"]
    command = [sys.executable, "-m", "flexgate", "replay", *days, "--out", str(folder)]
    subprocess.run(command, check=True, capture_output=True)


def whole_page(driver: webdriver.Chrome, path: Path) -> None:
    height = driver.execute_script("return document.documentElement.scrollHeight")
    metrics = {"width": WIDTH, "height": height, "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    driver.save_screenshot(str(path))


def settlement_view(driver: webdriver.Chrome, url: str, event_id: str, path: Path) -> None:
    driver.get(url)
    deadline = time.monotonic() + 30
    option = f'#settlement-event option[value="{event_id}"]'
    while not driver.find_elements("css selector", option):
        if time.monotonic() > deadline:
            raise SystemExit(f"the dashboard did not list {event_id} within 30 s")
        time.sleep(0.2)
    Select(driver.find_element("id", "settlement-event")).select_by_value(event_id)
    driver.find_element("css selector", "#settlement-form button[type=submit]").click()
    while len(driver.find_elements("css selector", "#settlement-view .rule")) < 2:
        if time.monotonic() > deadline:
            raise SystemExit(f"the dashboard did not settle {event_id} within 30 s")
        time.sleep(0.2)
    whole_page(driver, path)  # the section may reach below the window
    driver.find_element("id", "settlement").screenshot(str(path))


def shrink(path: Path) -> None:
    colours = Image.open(path).convert("RGB").quantize(256, method=Image.Quantize.FASTOCTREE)
    colours.save(path, optimize=True)
    print(f"saved {path} ({path.stat().st_size // 1024} kB)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/img"))
    parser.add_argument("--event", default="replay-05", help="the event the dashboard settles")
    parser.add_argument("--replay", type=Path, help="an earlier replay's folder, reused")
    args = parser.parse_args()
    folder = args.replay or Path(tempfile.mkdtemp())
    if args.replay is None:
        replay(folder)
    settings = GatewaySettings(
        database_url=f"sqlite:///{folder / 'replay-site' / 'gateway.db'}",
        lab=True,
        site_timezone="America/New_York",
        settlement_rules="10of10,sameday-3+2",
        settlement_holidays=default_holiday(FIRST_DAY, DAYS).isoformat(),
    )
    args.out.mkdir(parents=True, exist_ok=True)
    report, dashboard = args.out / "settlement-report.png", args.out / "dashboard-settlement.png"
    with ServerThread(create_app(settings)) as url:
        month = ["report", "--month", "2026-06", "--gateway", url, "--out", str(folder)]
        if flexgate(month) != 0:
            raise SystemExit("flexgate report failed")
        driver = browser()
        try:
            settlement_view(driver, url, args.event, dashboard)
            driver.get((folder / "settlement-2026-06.html").as_uri())
            whole_page(driver, report)
        finally:
            driver.quit()
    for path in (report, dashboard):
        shrink(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
