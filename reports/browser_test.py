"""The report in a real browser (ctest `report_browser`): renders report.html
from the H200 records in reports/testdata with headless Chromium, saves a
screenshot, and asserts that the page loaded, ran no script into an error, and
shows every plot with a non-zero size; that nothing is wider than a 1400 px
window, and that there is a table of contents.

    browser_test.py PATH/TO/flashcheck [SCREENSHOT.png]

Exits 77 (ctest's SKIP) where Chromium or a Python with matplotlib and Jinja2
is missing."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "testdata", "h200-2026-11-21")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "flashcheck"
    browser = chromium()
    if not browser:
        print("SKIP: Chromium is not installed (apt install chromium)")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.run([binary, "report", os.path.join(DATA, "accuracy.jsonl"), os.path.join(DATA, "bench.jsonl"),
                              "-o", tmp], capture_output=True, text=True, timeout=300)
        if run.returncode == 2 and ("matplotlib" in run.stderr or "Jinja2 is not installed" in run.stderr):
            print(f"SKIP: {run.stderr.strip()}")
            return 77
        if run.returncode != 0:
            print(f"FAIL: flashcheck report exited {run.returncode}: {run.stderr}")
            return 1
        page = "file://" + os.path.join(tmp, "report.html")
        env = dict(os.environ, HOME=tmp)  # Chromium writes its profile under HOME
        # At 1400 px, the width the report is read at: nothing may be wider than the window.
        dom = subprocess.run([browser, *FLAGS, "--window-size=1400,3000", "--virtual-time-budget=10000", "--dump-dom", page],
                             capture_output=True, text=True, timeout=120, env=env)
        body = re.search(r"<body([^>]*)>", dom.stdout)
        if dom.returncode != 0 or not body:
            print(f"FAIL: Chromium could not render the page (exit {dom.returncode}): {dom.stderr[-2000:]}")
            return 1
        attributes = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body.group(1)))
        print(f"rendered: {attributes}")
        problems = []
        if attributes.get("loaded") != "yes":
            problems.append("the page's load event never ran")
        if attributes.get("errors") != "0":
            problems.append(f"{attributes.get('errors')} script error(s)")
        if int(attributes.get("images", "0")) < 4:
            problems.append(f"only {attributes.get('images')} image(s); expected the plots")
        if attributes.get("overflow") != "0":
            problems.append(f"the page is {attributes.get('overflow')} px wider than a 1400 px window (a table or plot overflows)")
        if "<nav>" not in dom.stdout:
            problems.append("no table of contents")
        if attributes.get("broken-images") != "0":
            problems.append(f"{attributes.get('broken-images')} image(s) failed to load or have no size")
        screenshot = sys.argv[2] if len(sys.argv) > 2 else os.path.join(tmp, "report.png")
        if os.path.exists(screenshot):
            os.remove(screenshot)  # an earlier run's file must not pass for this one
        shot = subprocess.run([browser, *FLAGS, "--window-size=1500,4000", f"--screenshot={screenshot}", page],
                              capture_output=True, text=True, timeout=120, env=env)
        if shot.returncode != 0 or not os.path.exists(screenshot) or os.path.getsize(screenshot) < 10000:
            problems.append(f"no screenshot (exit {shot.returncode})")
        else:
            print(f"screenshot: {screenshot} ({os.path.getsize(screenshot)} bytes)")
        if problems:
            print("FAIL: " + "; ".join(problems))
            return 1
        print("PASS: the report loaded without errors and every plot has a size")
        return 0


if __name__ == "__main__":
    sys.exit(main())
