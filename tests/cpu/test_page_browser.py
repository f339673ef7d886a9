"""The page as a person sees it: index.html opened from disk in headless Chromium (Selenium).

Debian's ``chromium`` and ``chromium-driver``, found on PATH; nothing is downloaded: the
driver's path is given to Selenium's Service, so Selenium Manager (which would fetch a driver
over the network) is never run, and a test that reached it fails. Without the browser the tests
skip with the install command, except in CI (``CI=true``), where a missing browser fails.
"""

from __future__ import annotations

import base64
import io
import os
import shutil
from pathlib import Path

import page_report
import pytest
from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.selenium_manager import SeleniumManager

from harness.night import page
from recipes.tiers import REHEARSAL_MARK, REHEARSAL_SETTINGS_ENV

INSTALL = "apt-get install chromium chromium-driver"
BROWSERS = ("chromium", "chromium-browser")
SCREENSHOT = "index.png"


def browser_paths() -> tuple[str, str]:
    """(chromium, chromedriver) from PATH; missing: a skip here, a failure in CI."""
    browser = next(filter(None, map(shutil.which, BROWSERS)), None)
    driver = shutil.which("chromedriver")
    if browser and driver:
        return browser, driver
    missing = ", ".join(n for n, p in (("chromium", browser), ("chromedriver", driver)) if not p)
    why = f"the page's browser test needs {missing} on PATH: {INSTALL}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module, its console kept (goog:loggingPrefs)."""
    chromium, chromedriver = browser_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    with pytest.MonkeyPatch.context() as patch:

        def no_download(*args, **kwargs):
            raise AssertionError("Selenium Manager was run: it would download a driver")

        patch.setattr(SeleniumManager, "binary_paths", no_download)
        driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def open_page(driver, path: Path) -> list[dict]:
    """Load ``path`` from disk, wait for every image, save a full-page screenshot beside it.

    Returns the console entries of this load at level SEVERE (an image that does not load is one).
    """
    driver.get_log("browser")  # drop what an earlier page left
    driver.get(path.as_uri())
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, min(height + 100, 16000))
    driver.save_screenshot(str(path.with_name(SCREENSHOT)))
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def shown_claims(driver) -> dict[str, str]:
    """Each claim row the page shows: its name and its verdict's text."""
    rows = driver.find_elements(By.CSS_SELECTOR, "#claims tr.claim")
    return {
        r.get_attribute("data-claim"): r.find_element(By.CSS_SELECTOR, "td.verdict").text
        for r in rows
    }


def broken_images(driver) -> list[str]:
    """Every image that did not load (complete with no width), by its alt text."""
    return driver.execute_script(
        "return [...document.images]"
        ".filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt || i.src.slice(0, 40))"
    )


def undecodable(driver) -> list[str]:
    """Every inline image whose PNG does not decode whole: Chromium draws a cut-short PNG in part,
    with its natural width, so a truncated or corrupted data URI passes the width check alone."""
    bad = []
    for img in driver.find_elements(By.TAG_NAME, "img"):
        src = img.get_attribute("src")
        try:
            Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1], validate=True))).load()
        except (ValueError, OSError, IndexError):
            bad.append(img.get_attribute("alt"))
    return bad


def test_a_main_job_page_in_the_browser(browser, tmp_path, record_property):
    built = page_report.main_job(tmp_path, failing_reference=True)
    path = page.write(built.report_dir)
    errors = open_page(browser, path)
    assert shown_claims(browser) == built.claims
    assert broken_images(browser) == []
    assert undecodable(browser) == []
    assert len(browser.find_elements(By.TAG_NAME, "img")) == 1  # the loss curve
    assert errors == []
    for name in built.failing:
        row = browser.find_element(By.CSS_SELECTOR, f'tr.claim[data-claim="{name}"] td.verdict')
        assert row.value_of_css_property("background-color") == "rgba(248, 212, 212, 1)"
    assert browser.find_elements(By.CLASS_NAME, "mark") == []
    assert "REHEARSAL" not in browser.find_element(By.TAG_NAME, "body").text
    record_property("page_screenshot", str(path.with_name(SCREENSHOT)))


def test_a_rehearsal_night_page_in_the_browser(browser, tmp_path, monkeypatch, record_property):
    monkeypatch.setenv(REHEARSAL_SETTINGS_ENV, str(tmp_path / "settings.json"))
    built = page_report.night(tmp_path, rehearsal=True)
    path = page.write(built.report_dir, built.runs_log)
    errors = open_page(browser, path)
    assert shown_claims(browser) == built.claims
    assert broken_images(browser) == []
    assert undecodable(browser) == []
    images = browser.find_elements(By.TAG_NAME, "img")
    assert len(images) == len(page_report.trend_files(built.report_dir)) > 0
    assert errors == []
    figures = browser.find_elements(By.TAG_NAME, "figure")
    assert len(figures) == len(images)
    for figure in figures:
        assert f"REHEARSAL: {REHEARSAL_MARK}" in figure.text
    banner = browser.find_element(By.ID, "rehearsal-banner")
    assert banner.is_displayed() and "none is a trn2 result" in banner.text
    record_property("page_screenshot", str(path.with_name(SCREENSHOT)))
