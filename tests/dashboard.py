"""Drives wsx's dashboard in headless Chromium (Debian's chromium and chromedriver, through
Selenium): a wrong token is refused, the right one shows the peer up and live values that
change, a session is killed from the table, the token never appears in a URL, and the page
fits a phone's width. Saves screenshots. Run by tests/tests/api.rs inside gw-a's namespace;
prints one line per check and exits non-zero on the first failure."""

import argparse
import sys
import tempfile
import time

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as shown
from selenium.webdriver.support.ui import WebDriverWait


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--kill-client", required=True, help="client address of the session to kill")
    parser.add_argument("--screenshot", required=True, help="PNG path; a -phone variant beside it")
    args = parser.parse_args()

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,1500", "--user-data-dir=" + tempfile.mkdtemp()):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    # The page redraws its tables every second: an element found just before a redraw is
    # gone just after, so waits look again rather than fail.
    wait = WebDriverWait(driver, 20, ignored_exceptions=[StaleElementReferenceException])
    try:
        run(driver, wait, args)
    finally:
        driver.quit()


def check(what, ok):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        sys.exit(1)


def sign_in(driver, wait, token):
    field = wait.until(shown.visibility_of_element_located((By.ID, "token")))
    field.clear()
    field.send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()


def run(driver, wait, args):
    driver.get(args.url)
    check("/ leads to the dashboard's sign-in", driver.current_url.endswith("/dashboard/"))

    sign_in(driver, wait, "not-the-token")
    wait.until(shown.text_to_be_present_in_element((By.ID, "login-error"), "not accepted"))
    check("a wrong token is refused", not driver.find_element(By.ID, "dashboard").is_displayed())

    sign_in(driver, wait, args.token)
    wait.until(shown.visibility_of_element_located((By.ID, "dashboard")))
    wait.until(lambda d: any(
        row.find_elements(By.TAG_NAME, "td")[1].text == "up"
        for row in d.find_elements(By.CSS_SELECTOR, "#peers tbody tr")
        if row.find_elements(By.TAG_NAME, "td")[0].text == "gw-b"))
    check("the right token shows gw-b up", True)

    # Live values: the send rate's chart takes new, different values while traffic runs.
    seen = set()
    deadline = time.monotonic() + 20
    while len(seen) < 3 and time.monotonic() < deadline:
        latest = driver.find_element(By.ID, "chart-sent").get_attribute("data-latest")
        if latest and float(latest) > 0:
            seen.add(latest)
        time.sleep(0.5)
    check(f"the tunnel's send rate is live and changing ({len(seen)} values)", len(seen) >= 3)
    rtt = driver.find_element(By.ID, "chart-rtt").get_attribute("data-latest")
    check(f"the RTT chart has a value ({rtt} ms)", bool(rtt) and float(rtt) > 0)

    def session_row(d):
        for row in d.find_elements(By.CSS_SELECTOR, "#sessions tbody tr"):
            cells = row.find_elements(By.TAG_NAME, "td")
            if cells and cells[3].text == args.kill_client:
                return row
        return False

    wait.until(session_row)
    check("the held session is in the live table", True)
    time.sleep(8)  # a few more seconds of the charts, for the screenshot
    driver.save_screenshot(args.screenshot)

    def click_kill(d):
        row = session_row(d)
        if row:
            row.find_element(By.TAG_NAME, "button").click()
        return True

    wait.until(click_kill)
    wait.until(lambda d: not session_row(d))
    check("killing it from the table takes it out", True)

    check("the token is in no URL", args.token not in driver.current_url)

    # A phone: one column, nothing wider than the screen.
    driver.set_window_size(390, 844)
    time.sleep(1.5)
    overflow = driver.execute_script(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
    check(f"the page fits a phone's width (overflow {overflow} px)", overflow <= 0)
    driver.save_screenshot(args.screenshot.replace(".png", "-phone.png"))

    driver.find_element(By.ID, "logout").click()
    wait.until(shown.visibility_of_element_located((By.ID, "login")))
    stored = driver.execute_script("return sessionStorage.getItem('wsx-token')")
    check("signing out forgets the token", stored is None)


if __name__ == "__main__":
    main()
