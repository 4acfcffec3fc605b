"""The Bézier explorer in a real browser: JupyterLab + Debian Chromium driven by Playwright.

Open the explorer notebook, run all cells, drag one control point with the mouse and check that
the per-layer scales shown in the page are the Bézier scales of the control points shown in the
page, and that they changed in the dragged direction. Saves a screenshot to tests/artifacts/.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from lpes_nb.core.bezier import layer_scales
from lpes_nb.store.models import cache_dir

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

playwright = pytest.importorskip("playwright.sync_api", reason="the browser test needs the `playwright` package")
if CHROMIUM is None:
    pytest.skip("BROWSER TEST SKIPPED: no Chromium on this machine (scripts/test.sh installs Debian's `chromium` "
                "with apt-get where it can)", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab")
    (root / "notebooks").mkdir()
    shutil.copy(ROOT / "notebooks" / "07_bezier_explorer.ipynb", root / "notebooks" / "explorer.ipynb")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")  # lets the notebook find its project root
    (root / "lpes_nb").mkdir()
    home = tmp_path_factory.mktemp("home")
    # no "get notified about Jupyter news" toast over the widget in the screenshot (and no network call)
    settings = home / ".jupyter" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    port, token = _free_port(), "lpes-test-token"
    env = {**os.environ, "HOME": str(home), "JUPYTER_CONFIG_DIR": str(home / ".jupyter"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "LPES_OUTPUT_ROOT": str(root),
           "LPES_CACHE_DIR": str(cache_dir())}  # the converted model, not a second conversion in the fresh HOME
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
         "--ServerApp.open_browser=False", "--allow-root"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if server.poll() is not None or time.time() > deadline:
                server.kill()
                raise RuntimeError(f"JupyterLab did not start: {server.stderr.read().decode()[-2000:]}")
            time.sleep(0.3)
    yield url, token, home
    server.terminate()
    server.wait(timeout=20)


KERNEL_IDLE = """() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
                         const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
                         return k && k.status === 'idle'; }"""


def _read(page, selector: str) -> str:
    return page.locator(selector).inner_text()


def _settled_state(page) -> tuple[str, str]:
    """Points and scales once the page has caught up with every drag event (the kernel works through
    the queued move events after mouse-up): the kernel is idle, two reads 0.5 s apart agree, and the
    scales shown are those of the points shown. Bounded at 30 s: a page that stays inconsistent, or a
    kernel kept busy by widgets echoing each other, fails the test."""
    last = None
    for _ in range(60):
        page.wait_for_function(KERNEL_IDLE, timeout=30_000)
        state = (_read(page, ".lpes-points"), _read(page, ".lpes-scales"))
        if state == last and _consistent(*state):
            return state
        last = state
        page.wait_for_timeout(500)
    raise AssertionError(f"the explorer never settled to a consistent state; last state {last}")


def _parse(points_text: str, scales_text: str):
    return np.array(json.loads(points_text.split(":", 1)[1])), [float(v) for v in re.findall(r"\d+\.\d+", scales_text)]


def _consistent(points_text: str, scales_text: str) -> bool:
    points, scales = _parse(points_text, scales_text)
    return len(scales) == 30 and np.allclose(scales, layer_scales(points, 30), atol=1e-4)


def test_dragging_a_control_point_updates_the_scales(lab):
    url, token, home = lab
    artifacts = ROOT / "tests" / "artifacts"
    artifacts.mkdir(exist_ok=True)
    with playwright.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(str(home / "chromium"), executable_path=CHROMIUM, headless=True,
                                                       args=FLAGS, viewport={"width": 1400, "height": 1000})
        try:
            page = context.new_page()
            page.goto(f"{url}/lab/tree/notebooks/explorer.ipynb?token={token}")
            page.wait_for_function(KERNEL_IDLE, timeout=60_000)
            page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
            page.wait_for_selector("code.lpes-scales", timeout=60_000)
            before = _settled_state(page)[1]
            assert "1.5000" in before

            # the draggable handles are the 4 big dots of the first figure (the 30 small ones mark the layers)
            figure = page.locator(".bqplot.figure").first
            figure.scroll_into_view_if_needed()
            page.wait_for_timeout(300)  # the notebook panel scrolls smoothly
            dots = figure.locator("path.dot")
            boxes = sorted((dots.nth(i).bounding_box() for i in range(dots.count())), key=lambda b: -b["width"])
            handles = sorted(boxes[:4], key=lambda b: b["x"])
            assert dots.count() == 34 and handles[0]["width"] > 2 * boxes[4]["width"]
            box = handles[1]
            x0, y0 = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
            page.mouse.move(x0, y0)
            page.mouse.down()
            for step in range(1, 11):
                page.mouse.move(x0 + 3 * step, y0 - 9 * step)  # up (larger scale) and a little right
            page.mouse.up()
            page.wait_for_function(
                "(before) => document.querySelector('.lpes-scales').innerText !== before", arg=before, timeout=20_000)
            points, shown_scales = _parse(*_settled_state(page))
            page.screenshot(path=str(artifacts / "explorer_after_drag.png"), full_page=True)
            # the widget alone: docs/explorer.png, the README's picture of the explorer, is this file
            page.locator(".jp-OutputArea-output").last.screenshot(path=str(artifacts / "explorer_widget.png"))
        finally:
            context.close()
    assert len(shown_scales) == 30
    assert points[1, 1] > 1.5 and np.all(np.diff(points[:, 0]) > 0)
    np.testing.assert_allclose(shown_scales, layer_scales(points, 30), atol=1e-4)  # page consistent with the point
    assert max(shown_scales) > 1.5 + 1e-3  # and the scales really moved up
