"""Saves docs/img/dashboard.png: the dashboard in headless Chromium during a `flexgate lab` event.

    python scripts/dashboard-screenshot.py [--out docs/img/dashboard.png]

Runs the lab (mock VTN -> gateway -> simulated agents), opens the page it prints, waits until
the event has been active for a while, and saves the whole page. Needs chromium, chromedriver
and selenium (`scripts/ci-chromium.sh`, `pip install -e '.[test]'`).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

ACTIVE_FOR_S = 30.0  # enough of the event on the chart to read the cut and the loop


def browser() -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or ""
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1500,900"):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/img/dashboard.png"))
    args = parser.parse_args()
    lab = subprocess.Popen(
        [sys.executable, "-m", "flexgate", "lab", "--duration", "60", "--out", tempfile.mkdtemp()],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert lab.stdout is not None
    driver = browser()
    try:
        for line in lab.stdout:
            found = re.search(r"dashboard: (\S+) \(API token (\S+)\)", line)
            if found:
                url, token = found.groups()
                break
        else:
            raise SystemExit("the lab printed no dashboard address")
        driver.get(url)
        driver.execute_script("sessionStorage.setItem('flexgate.token', arguments[0])", token)
        driver.refresh()
        driver.find_element("id", "span").send_keys("5 min")
        deadline = time.monotonic() + 120
        while "left" not in driver.find_element("id", "active-event").text:
            if time.monotonic() > deadline:
                raise SystemExit("no event became active within 120 s")
            time.sleep(0.5)
        time.sleep(ACTIVE_FOR_S)
        height = driver.execute_script("return document.documentElement.scrollHeight")
        metrics = {"width": 1500, "height": height, "deviceScaleFactor": 1, "mobile": False}
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)  # the whole page
        time.sleep(2.5)  # one update at the new size
        args.out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(args.out))
        print(f"saved {args.out}")
        for _ in lab.stdout:  # the lab ends its event, checks the recovery and stops
            pass
        return lab.wait()
    finally:
        driver.quit()
        if lab.poll() is None:
            lab.terminate()
            lab.wait(timeout=30)


if __name__ == "__main__":
    raise SystemExit(main())
