"""The HTML report in headless Chromium: every plot renders, nothing errs, nothing is fetched;
the verdict leads, the comparability gate's sections are there, no frontier is drawn from one
point, and at 600 px nothing is wider than the page.

Skipped without Chromium, except in CI (CI=true), where a missing browser fails the test.
"""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from typer.testing import CliRunner

from openjarvis.cli.ipw import app
from openjarvis.store import open_store
from tests.synthetic import add_run, make_host

__all__: list[str] = []

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",  # tests run as root in CI containers, where the sandbox cannot start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
]
CHROMIUM_TIMEOUT_S = 120

# Injected into a copy of the report, right after its CSP tag: records errors and CSP refusals.
WATCH = """<script>
window.openjarvisErrors = [];
addEventListener("error", (e) => openjarvisErrors.push("error: " + (e.message ||
  (e.target && (e.target.src || e.target.href)) || "resource")), true);
document.addEventListener("securitypolicyviolation",
  (e) => openjarvisErrors.push("blocked: " + e.blockedURI + " by " + e.violatedDirective));
</script>"""
# Injected before </body>: measures every plot's SVG as laid out, and writes the verdict in the DOM.
CHECK = """<script>
const plots = [...document.querySelectorAll("figure.plot")].map((figure) => {
  const svg = figure.querySelector("svg");
  const box = svg.getBoundingClientRect();
  const drawn = svg.getBBox();
  return {name: figure.dataset.plot, width: box.width, height: box.height,
          drawnArea: drawn.width * drawn.height,
          marks: svg.querySelectorAll("path, use, text, g").length};
});
const headline = document.querySelector("#headline");
const page = {
  width: document.documentElement.clientWidth,
  headlineTop: headline ? headline.getBoundingClientRect().top : null,
  headlineText: headline ? headline.textContent : "",
  sections: [...document.querySelectorAll('section[id^="section-"] h3')].map((h) => h.textContent),
  frontiers: [...document.querySelectorAll('figure.plot g[id^="frontier-"]')].map((g) => g.id),
  widest: Math.max(...[...document.querySelectorAll("figure.plot svg, table")].map(
    (e) => e.getBoundingClientRect().right)),
};
const out = document.createElement("pre");
out.id = "openjarvis-check";
out.textContent = JSON.stringify({plots, page, errors: openjarvisErrors});
document.body.appendChild(out);
</script>"""


@pytest.fixture(scope="module")
def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    message = "Chromium is not installed (Debian: apt-get install chromium)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message}; CI must run the browser tests")
    pytest.skip(message)


def run_chromium(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_S, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def console_messages(stderr: str) -> list[str]:
    """What the page logged: Chromium writes each console message as an INFO:CONSOLE line."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("report")
    db = str(folder / "ipw.db")
    h200 = make_host("h200-box", gpus=("NVIDIA H200 (GPU-aaaa)",))
    with open_store(db) as store:
        add_run(store, h200, "small", accuracy=0.3, joules_per_task=50.0, trace_samples=4000)
        add_run(store, h200, "large", accuracy=0.7, joules_per_task=300.0, seed=1)
        add_run(store, make_host("laptop"), "small", method="estimate", seed=2)
        add_run(store, None, "gpt-4o", engine="cloud", method="estimate", accuracy=0.9, seed=3)
        # Alone in its scope: a section of one run, which must draw no frontier.
        add_run(store, h200, "lone", scope="accelerator", tasks=8, seed=4)
    result = CliRunner().invoke(app, ["report", "--db", db, "--out", str(folder / "out")])
    assert result.exit_code == 0, result.exception
    return folder / "out" / "report.html"


def check_page(chromium: str, report: Path, tmp_path: Path, width_px: int) -> dict:
    """Load a copy of the report with the two watch scripts at `width_px` wide; the verdict."""
    html = report.read_text()
    policy_end = html.index(">", html.index('http-equiv="Content-Security-Policy"')) + 1
    # The copy may run our two inline scripts; every other load stays forbidden.
    checked = (html[:policy_end] + WATCH + html[policy_end:]).replace(
        "default-src 'none';", "default-src 'none'; script-src 'unsafe-inline';"
    )
    checked = checked.replace("</body>", CHECK + "</body>")
    page = tmp_path / "checked.html"
    page.write_text(checked)
    result = run_chromium(
        chromium,
        tmp_path / "profile",
        f"--window-size={width_px},2000",
        "--dump-dom",
        page.as_uri(),
    )
    found = re.search(r'<pre id="openjarvis-check">(.*?)</pre>', result.stdout, re.DOTALL)
    assert found, result.stdout[-2000:]
    verdict = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert console_messages(result.stderr) == []
    return verdict


def test_every_plot_renders_without_errors(chromium: str, report: Path, tmp_path: Path) -> None:
    expected = re.findall(r'data-plot="([a-z-]+)"', report.read_text())
    assert len(expected) == 6  # the cloud run brings the local-versus-cloud panel
    verdict = check_page(chromium, report, tmp_path, 1200)
    assert verdict["errors"] == []
    assert [plot["name"] for plot in verdict["plots"]] == expected
    for plot in verdict["plots"]:
        assert plot["width"] > 300 and plot["height"] > 100, plot
        assert plot["drawnArea"] > 10_000 and plot["marks"] > 20, plot


def test_the_verdict_leads_and_the_gate_keeps_sections_apart(
    chromium: str, report: Path, tmp_path: Path
) -> None:
    """Read at 600 px, as on a small screen: the verdict is on the first screen, each scope
    and method class has its own section with its n, the one-run section draws no frontier,
    and no plot or table runs off the page."""
    verdict = check_page(chromium, report, tmp_path, 600)
    page = verdict["page"]
    assert page["headlineTop"] is not None and page["headlineTop"] < 400, page
    assert "passes per kJ" in page["headlineText"] and "What limits this" in page["headlineText"]
    # Only a section of two runs or more is a section of its own; the others are one table.
    assert page["sections"] == [
        "humaneval · system scope · measured energy · n = 20",
        "humaneval · system scope · estimated energy · n = 20",
    ]
    html = report.read_text()
    alone = html[html.index('id="sections-of-one-run"') :]
    assert "humaneval · accelerator scope · measured energy · n = 8" in alone
    document = json.loads((report.parent / "report.json").read_text())
    with_frontier = [i for i, s in enumerate(document["sections"]) if s["pareto_frontier"]]
    # Panels follow the sections; the lone accelerator run (panel 1) has none.
    assert 1 not in with_frontier and 0 in with_frontier
    assert sorted(page["frontiers"]) == [f"frontier-{i}" for i in with_frontier]
    assert page["widest"] <= page["width"] + 1, page


def test_screenshot_of_the_report_as_shipped(chromium: str, report: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    result = run_chromium(
        chromium,
        tmp_path / "profile",
        f"--screenshot={shot}",
        "--window-size=1200,3000",
        "--hide-scrollbars",
        report.as_uri(),
    )
    # The report has no script, so any console line is the browser complaining (a refused load).
    assert console_messages(result.stderr) == []
    pixels = imread(shot)
    assert pixels.shape[:2] == (3000, 1200)
    # Not a blank page: plenty of ink, and colour (the hosts' markers), not only black text.
    ink = pixels[..., :3].mean(axis=2) < 0.9
    assert ink.mean() > 0.02
    saturation = pixels[..., :3].max(axis=2) - pixels[..., :3].min(axis=2)
    assert np.count_nonzero(saturation > 0.3) > 1000
