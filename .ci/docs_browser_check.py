"""The built site in a real browser: serve site/ on 127.0.0.1 and open every page in headless Chromium.

``make docs-check`` runs it after ``make docs``: ``python .ci/docs_browser_check.py [site] [--screenshots DIR]``.
Chromium is Debian's (``/usr/bin/chromium``, or $CHROMIUM), driven by Playwright for Python; nothing is downloaded.
For the home page, a how-to page, the Keras guide, Development, and the API pages of
``lossscale.torch.LossScaleOptimizer`` and ``lossscale.keras.LossScaleOptimizer`` it asserts:

- the page title (the page's own title, then the site name);
- the navigation: the site's sections are links, and the current page is marked active;
- a rendered code block (Pygments-highlighted, with its copy button);
- and once, the search box: typing "hysteresis" lists at least one result that links into the site.

On every page of the site (each ``index.html`` under site/, the API pages included), at a 1280 px wide window:

- no console error, no uncaught page error and no failed request;
- no code block and no table wider than the page's text column (nothing scrolls sideways, nothing is cut off);
- no doctest rendered as text: a ``>>>`` outside a code block, or the nested quotes Markdown makes of a bare
  ``>>>`` line (whose output then shows as junk or not at all);
- no bold or italic opened inside a word: two powers written ``2**16 ... 2**20`` in one paragraph render as
  "2<b>16 ... 2</b>20" (escape the asterisks in Markdown, or put the power in a code span);
- on the API pages, every docstring example is a highlighted code block (the ``>>>`` prompts rendered by
  Pygments), and the number of them is printed.

A full-page screenshot of the named pages (and of the search results) goes to --screenshots (default
site-screenshots/). It prints each page it opened and exits non-zero on any miss, each failure naming its page.
Requests the browser aborts for assets when it leaves a page (the search script, on a loaded machine) are noted,
not failed: see :class:`PageEvents`.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import socket
import sys
import threading
from pathlib import Path

from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from playwright.sync_api import expect, sync_playwright

ROOT = Path(__file__).resolve().parents[1]
SITE_NAME = "lossscale"
NAV_SECTIONS = ("Getting started", "Concepts", "How-to", "Migration", "Benchmarks", "API reference", "Changelog")
# path, expected <title> prefix, the <h1> text, the anchor whose code block must render (None: any on the page)
PAGES = [
    ("", SITE_NAME, "lossscale", None),
    ("how-to/accumulation/", "Gradient accumulation", "Gradient accumulation", None),
    ("api/torch/#lossscale.torch.LossScaleOptimizer", "lossscale.torch", "lossscale.torch",
     "lossscale.torch.LossScaleOptimizer"),
    ("keras/", "Keras in depth", "lossscale.keras", None),
    ("api/keras/#lossscale.keras.LossScaleOptimizer", "lossscale.keras", "lossscale.keras",
     "lossscale.keras.LossScaleOptimizer"),
    ("development/", "Development", "Development", None),
]


#: The pages where docstring examples must render as code: each needs at least this many doctest blocks.
API_PAGES = {"api/lossscale/": 5, "api/torch/": 5, "api/jax/": 10, "api/keras/": 2, "api/torch-integrations/": 0,
             "api/demo/": 0}
WIDTH = 1280  # the window the width checks run at (a common laptop screen)

# Run in the page: what a reader would see wrong. Returns a list of problems (strings).
LAYOUT_PROBLEMS = """() => {
  const article = document.querySelector("article");
  const problems = [];
  const where = (el) => {
    const h = el.closest("[id]");
    return (h ? "#" + h.id + " " : "") + JSON.stringify(el.textContent.trim().slice(0, 70));
  };
  for (const pre of article.querySelectorAll("pre")) {
    const box = pre.querySelector("code") || pre;
    if (box.scrollWidth > box.clientWidth + 1)
      problems.push(`code block scrolls sideways (${box.scrollWidth} px of ${box.clientWidth}): ${where(pre)}`);
  }
  for (const table of article.querySelectorAll("table")) {
    const wrap = table.closest(".md-typeset__scrollwrap") || table.parentElement;
    if (table.scrollWidth > wrap.clientWidth + 1)
      problems.push(`table wider than the page (${table.scrollWidth} px of ${wrap.clientWidth}): ${where(table)}`);
  }
  const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode())
    if (node.textContent.includes(">>>") && !node.parentElement.closest("pre, code"))
      problems.push(`doctest rendered as text: ${where(node.parentElement)}`);
  for (const em of article.querySelectorAll("strong, em")) {  // emphasis opened inside a word: 2**16 ... 2**20
    const before = em.previousSibling;
    if (!em.closest("pre, code") && before && before.nodeType === Node.TEXT_NODE && /[0-9A-Za-z]$/.test(before.textContent)
        && /^[-0-9A-Za-z]/.test(em.textContent))
      problems.push(`emphasis made inside a word (an unescaped ** or *, e.g. 2**16): ${where(em)}`);
  }
  for (const quote of article.querySelectorAll("blockquote blockquote"))  // once per nest, at its second level
    if (!quote.parentElement.closest("blockquote blockquote"))
      problems.push(`nested quotes (a bare >>> line rendered as text): ${where(quote)}`);
  return problems;
}"""
# Run in the page: [docstring examples rendered as highlighted code, output lines shown in them].
DOCTEST_BLOCKS = """() => {
  const blocks = [...document.querySelectorAll("article div.highlight pre code")]
    .filter((code) => code.querySelector("span.gp") && code.textContent.trimStart().startsWith(">>>"));
  return [blocks.length, blocks.reduce((n, code) => n + code.querySelectorAll("span.go").length, 0)];
}"""


def site_pages(site: Path) -> list[str]:
    """Every page of the built site, as a path under it ("" for the home page); not 404.html or search."""
    pages = []
    for index in sorted(site.rglob("index.html")):
        rel = index.parent.relative_to(site).as_posix()
        if rel.split("/")[0] not in ("search", "assets"):
            pages.append("" if rel == "." else rel + "/")
    return pages


def check_layout(page, base: str, path: str) -> tuple[list[str], str]:
    """The problems :data:`LAYOUT_PROBLEMS` finds on one page (and the doctest blocks of an API page), and a note."""
    page.goto(base + path, wait_until="networkidle")
    # The theme's script still rewrites code blocks (copy buttons) after the load event; on a loaded machine a check
    # can run in the middle of it. A problem counts only if it is still there a second later, and the doctest
    # blocks are counted once they are all there (or after 10 s, when the count is what it is).
    problems = page.evaluate(LAYOUT_PROBLEMS)
    if problems:
        page.wait_for_timeout(1000)
        problems = [problem for problem in page.evaluate(LAYOUT_PROBLEMS) if problem in problems]
    found = [f"{path or 'home'}: {problem}" for problem in problems]
    note = ""
    if path in API_PAGES:
        try:
            page.wait_for_function(f"() => ({DOCTEST_BLOCKS})()[0] >= {API_PAGES[path]}", timeout=10_000)
        except PlaywrightTimeoutError:
            pass  # reported below, with the count found
        blocks, outputs = page.evaluate(DOCTEST_BLOCKS)
        note = f"; {blocks} docstring examples as code blocks ({outputs} output lines)"
        if blocks < API_PAGES[path]:
            found.append(f"{path}: {blocks} docstring examples rendered as code, expected at least {API_PAGES[path]}")
    return found, note


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def check_page(page, base: str, path: str, title: str, h1: str, anchor: str | None, shots: Path) -> None:
    page.goto(base + path, wait_until="networkidle")
    expect(page).to_have_title(f"{title} - {SITE_NAME}" if path else SITE_NAME)
    expect(page.locator("article h1").first).to_contain_text(h1)
    # Navigation: the primary sidebar lists every section, and marks the page being read.
    nav = page.locator("nav.md-nav--primary")
    for section in NAV_SECTIONS:
        expect(nav.get_by_text(section, exact=True).first).to_be_attached()
    if path:
        expect(nav.locator("a.md-nav__link--active").first).to_be_attached()
    # A rendered code block: highlighted by Pygments (spans inside <code>), with Material's copy button.
    scope = page.locator(f'[id="{anchor}"]').locator("xpath=..") if anchor else page.locator("article")
    code = scope.locator("div.highlight pre code").first
    expect(code).to_be_visible()
    assert code.locator("span").count() > 3, f"{path or 'home'}: the code block is not highlighted"
    if anchor:
        expect(page.locator(f'[id="{anchor}"]')).to_be_visible()
        expect(scope.locator(".doc-contents").first).to_contain_text("Cost")  # the docstring's cost line rendered
    page.screenshot(path=str(shots / f"{(path.split('#')[0].strip('/') or 'home').replace('/', '_')}.png"),
                    full_page=not anchor)


def check_search(page, base: str, shots: Path) -> None:
    page.goto(base, wait_until="networkidle")
    box = page.locator("input.md-search__input")
    box.click()
    box.press_sequentially("hysteresis", delay=50)  # typed, as a reader does: Material searches on key events
    results = page.locator(".md-search-result__item a")
    expect(results.first).to_be_visible(timeout=15_000)
    expect(page.locator(".md-search-result__meta")).to_contain_text("matching")
    href = results.first.get_attribute("href") or ""
    assert href.startswith(base) or not href.startswith("http"), f"search result links off the site: {href}"
    page.screenshot(path=str(shots / "search_hysteresis.png"))


class PageEvents:
    """The browser's complaints (console errors, page errors, failed requests, HTTP errors), each named with the page
    open when it came.

    A request the browser *aborted* (``net::ERR_ABORTED``) for something other than the page itself, such as the
    search index or its worker script, is not a failure: the browser cancels what is still loading when the check
    moves to the next page, and on a loaded machine that is often the search script. A missing asset still fails,
    as its HTTP 404; the page's own document failing still fails."""

    def __init__(self, problems: list[str]) -> None:
        self.problems, self.page, self.aborted = problems, "home", 0

    def on_page(self, name: str) -> None:
        self.page = name

    def attach(self, page) -> None:
        page.on("console", lambda m: m.type == "error" and self._add(f"console error: {m.text}"))
        page.on("pageerror", lambda e: self._add(f"page error: {e}"))
        page.on("requestfailed", self._request_failed)
        page.on("response", lambda r: r.status >= 400 and self._add(f"HTTP {r.status}: {r.url}"))

    def _add(self, problem: str) -> None:
        self.problems.append(f"{self.page}: {problem}")

    def _request_failed(self, request) -> None:
        failure = request.failure or ""
        if "ERR_ABORTED" in failure and request.resource_type != "document":
            self.aborted += 1
            print(f"note {self.page}: the browser aborted {request.url} ({request.resource_type}) when leaving the page")
            return
        self._add(f"request failed: {request.url} {failure}")


FAILED = object()


def attempt(problems: list[str], name: str, check, *args):
    """``check(*args)`` for one page; a failed expectation or assertion becomes a problem named with the page (and
    :data:`FAILED` is returned), so one page's failure neither hides the others nor comes without its page.
    A timeout (a page or an expectation slower than Playwright's limit, as on a loaded machine) is tried once more.
    """
    for tries in (1, 2):
        try:
            return check(*args)
        except PlaywrightTimeoutError as error:
            if tries == 1:
                print(f"note {name or 'home'}: timed out ({str(error).strip().splitlines()[0]}); trying once more")
                continue
            problems.append(f"{name or 'home'}: timed out twice: {str(error).strip().splitlines()[0]}")
        except Exception as error:  # noqa: BLE001 - expect's and assert's errors alike: report, go on to the next page
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            problems.append(f"{name or 'home'}: {first}")
        break
    return FAILED


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", nargs="?", default=str(ROOT / "site"))
    parser.add_argument("--screenshots", default=str(ROOT / "site-screenshots"))
    args = parser.parse_args()
    site, shots = Path(args.site), Path(args.screenshots)
    if not (site / "index.html").exists():
        sys.exit(f"{site}/index.html is missing: run `make docs` first.")
    shots.mkdir(parents=True, exist_ok=True)
    chromium = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    if not Path(chromium).exists():
        sys.exit(f"{chromium} is missing: apt-get install -y chromium (or set CHROMIUM).")
    server, base = serve(site)
    problems: list[str] = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": WIDTH, "height": 1000})
            events = PageEvents(problems)
            events.attach(page)
            for path, title, h1, anchor in PAGES:
                events.on_page(path or "home")
                if attempt(problems, path, check_page, page, base, path, title, h1, anchor, shots) is not FAILED:
                    print(f"ok  {base}{path}")
            events.on_page("home, search")
            if attempt(problems, "home, search", check_search, page, base, shots) is not FAILED:
                print("ok  search: 'hysteresis' has results")
            pages = site_pages(site)
            missing = sorted(set(API_PAGES) - set(pages))
            problems.extend(f"{path}: API page missing from the site" for path in missing)
            for path in pages:
                events.on_page(path or "home")
                before = len(problems)
                result = attempt(problems, path, check_layout, page, base, path)
                found, note = ([], "") if result is FAILED else result
                problems.extend(found)
                failed = len(problems) > before
                print(f"{'FAIL' if failed else 'ok'}  {base}{path} at {WIDTH} px: code blocks, tables, doctests{note}")
            browser.close()
    finally:
        server.shutdown()
    for problem in problems:
        print("FAIL", problem)
    print(f"screenshots in {shots}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
