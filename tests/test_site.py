"""The static site: its table of contents follows notebooks/, and the built pages work in a real
browser (headless Chromium): no console errors, math rendered, images loaded, "next" links followed,
nothing fetched from outside the site. Screenshots land in _build/screenshots/ for a human to look at."""
import functools
import html
import http.server
import importlib
import inspect
import re
import shutil
import threading
from pathlib import Path

import pytest

import course
from course import site

HTML = site.BUILD / "html"
HTML_INSTRUCTORS = site.BUILD / "html-instructors"  # make site SOLUTIONS=1
EXERCISE_PAGE = "notebooks/w33_softmax/d4_triton_softmax.html"  # shows softmax_kernel, the exercise w33.triton_softmax
SHOTS = site.BUILD / "screenshots"
DAY_PAGE = "notebooks/w33_softmax/d1_softmax_math.html"
RAW_TEX = ("$$", "\\frac", "\\sum", "\\begin{", "\\(", "\\[")


def test_toc_lists_every_notebook_in_tree_order_with_the_overview_first():
    on_disk = sorted(p.relative_to(site.ROOT).with_suffix("").as_posix() for p in site.NOTEBOOKS.glob("w*/*.ipynb"))
    in_toc = [f for _, files in site.parts() for f in files]
    assert in_toc == on_disk
    assert all(files[0].endswith("/00_overview") for _, files in site.parts())
    text = site.toc_text()
    assert all(f"file: {f}\n" in text for f in on_disk)


def test_a_week_without_an_overview_is_refused(tmp_path, monkeypatch):
    (tmp_path / "w99_new").mkdir()
    (tmp_path / "w99_new" / "d1_first.ipynb").write_text('{"cells": []}')
    monkeypatch.setattr(site, "NOTEBOOKS", tmp_path)
    with pytest.raises(ValueError, match="00_overview"):
        site.parts()


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser_page():
    if _chromium() is None:
        pytest.skip("no chromium on this machine (Debian: apt-get install chromium; .ci/run installs it)")
    if not (HTML / "index.html").exists():
        pytest.skip("the site is not built: run `make site` (make test does)")
    from playwright.sync_api import sync_playwright
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.problems, page.outside = [], []
        page.on("console", lambda m: m.type == "error" and page.problems.append(f"console: {m.text}"))
        page.on("pageerror", lambda e: page.problems.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: page.problems.append(f"failed request: {r.url}"))

        def only_local(route):
            if route.request.url.startswith(base) or route.request.url.startswith("data:"):
                route.continue_()
            else:
                page.outside.append(route.request.url)
                route.abort()
        page.route("**/*", only_local)
        page.base = base
        yield page
        browser.close()
    server.shutdown()


def _open(page, path: str, shot: str):
    page.problems.clear()
    page.goto(page.base + path, wait_until="networkidle")
    page.wait_for_function("() => !window.MathJax || (window.MathJax.startup && window.MathJax.startup.promise)")
    page.evaluate("() => window.MathJax ? window.MathJax.startup.promise : null")
    page.screenshot(path=str(SHOTS / shot), full_page=True)


def _check_page(page, min_math: int):
    assert page.problems == [], page.problems
    assert page.outside == [], f"requests to outside the site (a CDN?): {page.outside}"
    text = page.inner_text("article")
    leaked = [t for t in RAW_TEX if t in text]
    assert not leaked, f"raw TeX visible on {page.url}: {leaked}"
    assert page.locator("mjx-container").count() >= min_math, "math was not rendered by MathJax"
    broken = page.evaluate("""() => [...document.images]
        .filter(i => !(i.complete && i.naturalWidth > 0 && i.getBoundingClientRect().width > 0))
        .map(i => i.src)""")
    assert broken == [], f"images not loaded: {broken}"


def _follow_next(page, expected_suffix: str):
    link = page.locator("a.right-next")
    assert link.count() == 1, f"no 'next' link on {page.url}"
    link.click()
    page.wait_for_load_state("networkidle")
    assert page.url.endswith(expected_suffix), page.url
    assert page.problems == [], page.problems


def test_landing_page_renders_and_leads_to_the_syllabus(browser_page):
    page = browser_page
    _open(page, "index.html", "landing.png")
    assert "book/intro.html" in page.url
    assert "make lab" in page.inner_text("article") and "without a GPU" in page.inner_text("article")
    _check_page(page, min_math=0)
    assert page.locator("link[rel='icon']").count() == 1, "no favicon: browsers ask for a missing /favicon.ico"
    _follow_next(page, "book/syllabus.html")


def test_week33_day_page_renders_math_plots_and_links_to_the_next_day(browser_page):
    page = browser_page
    _open(page, DAY_PAGE, "w33_d1.png")
    _check_page(page, min_math=5)
    assert page.locator("article img").count() >= 1, "the day's plots are missing"
    assert "course.check" in page.inner_text("article")
    _follow_next(page, "notebooks/w33_softmax/d2_block_softmax.html")
    page.screenshot(path=str(SHOTS / "w33_d2.png"), full_page=True)
    _check_page(page, min_math=1)


def test_on_a_phone_the_menu_opens_and_leads_to_another_day(browser_page):
    """At 390 px the sidebar hides behind the menu button: pressing it must show the menu, and a link in it must
    work."""
    page = browser_page
    page.set_viewport_size({"width": 390, "height": 844})
    try:
        _open(page, DAY_PAGE, "w33_d1_phone.png")
        buttons = page.locator("button.primary-toggle")
        visible = [buttons.nth(i) for i in range(buttons.count()) if buttons.nth(i).is_visible()]
        assert visible, "no visible menu button at 390 px"
        visible[0].click()
        link = page.locator("a.reference.internal[href$='d2_block_softmax.html']:visible").first
        link.wait_for(state="visible", timeout=5000)
        page.screenshot(path=str(SHOTS / "w33_d1_phone_menu.png"))
        link.click()
        page.wait_for_load_state("networkidle")
        assert page.url.endswith("notebooks/w33_softmax/d2_block_softmax.html"), page.url
        assert page.problems == [], page.problems
    finally:
        page.set_viewport_size({"width": 1400, "height": 1000})


def _shown(obj, monkeypatch, show: str | None) -> str:
    shown = []
    monkeypatch.setattr("IPython.display.display", shown.append)
    if show:
        monkeypatch.setenv("COURSE_SHOW", show)
    else:
        monkeypatch.delenv("COURSE_SHOW", raising=False)
    course.show_source(obj)
    return shown[0].data


def test_show_source_shows_the_stub_in_the_learners_edition_and_the_reference_otherwise(monkeypatch):
    solved = importlib.import_module("solutions.w33_softmax")
    for obj in (solved.stable_softmax, solved.BLOCK_SOFTMAX_SRC, solved.softmax_kernel):
        reference, stub = _shown(obj, monkeypatch, None), _shown(obj, monkeypatch, "stubs")
        assert "BEGIN SOLUTION" in reference and "YOUR CODE HERE" not in reference
        assert "YOUR CODE HERE" in stub and "BEGIN SOLUTION" not in stub
        assert stub.strip().splitlines()[0] == reference.strip().splitlines()[0], "the same definition"
    helper = solved._row_warps  # no exercise in it: the stub's text is the reference's
    assert _shown(helper, monkeypatch, "stubs").strip() == _shown(helper, monkeypatch, None).strip()
    from course.cuda import occupancy  # not in an exercise module: shown as it is
    assert _shown(occupancy, monkeypatch, "stubs") == inspect.getsource(occupancy)


def test_the_learners_site_shows_the_stub_where_a_lesson_shows_an_exercise(browser_page):
    page = browser_page
    _open(page, EXERCISE_PAGE, "w33_d4.png")
    outputs = "\n".join(page.locator("article .cell_output").all_inner_texts())
    assert "def softmax_kernel" in outputs and "YOUR CODE HERE" in outputs, "the stub is not shown"
    assert "BEGIN SOLUTION" not in page.inner_text("article"), "the learner's site shows a solution"


def test_the_instructors_site_shows_the_reference_solution():
    page = HTML_INSTRUCTORS / EXERCISE_PAGE
    if not page.exists():
        pytest.skip("the instructors' edition is not built: `make site SOLUTIONS=1`")
    text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
    assert "def softmax_kernel" in text and "BEGIN SOLUTION" in text
