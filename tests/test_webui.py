"""The chat page at /: served from package data with nothing fetched from elsewhere, off with
--no-webui, and driven in a real headless Chromium (the system's, through selenium and its
chromedriver) against `lite serve` of SmolLM2 on the CPU: the API key typed in, a question whose
answer streams in, and a second question sent with the first exchange. A screenshot is saved into
$TEST_ARTIFACTS_DIR when set, else pytest's tmp dir. Bounded: short replies, every wait has a limit."""
import os
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from lite.cli.main import cli  # noqa: E402
from lite.server.app import ServerState, create_app  # noqa: E402

N = 12
WAIT_S = 300
SYSTEM = "You are a terse assistant."


def test_page_served_self_contained_and_off_with_no_webui():
    page = TestClient(create_app(ServerState("m"))).get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "v1/chat/completions" in page.text
    assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/|@import", page.text)   # no network
    off = TestClient(create_app(ServerState("m", webui=False))).get("/")
    assert off.status_code == 404 and off.json()["error"]["type"] == "not_found_error"
    keyed = TestClient(create_app(ServerState("m", api_key="k")))
    assert keyed.get("/").status_code == 200 and keyed.get("/v1/models").status_code == 401
    assert "--no-webui" in CliRunner().invoke(cli, ["serve", "--help"]).output


def _browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("no Chromium and chromedriver installed (Debian: apt-get install chromium chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,900"):
        opts.add_argument(a)
    from selenium.webdriver.chrome.service import Service
    return webdriver.Chrome(options=opts, service=Service(driver))


@pytest.fixture(scope="module")
def browser():
    b = _browser()
    try:
        yield b
    finally:
        b.quit()


@pytest.fixture(scope="module")
def server():
    pytest.importorskip("openai")
    from conftest import real_model
    from test_server import ALIAS, KEY, ServerProcess
    srv = ServerProcess(real_model("smollm2"), "-np", "2", "-c", "512", "--alias", ALIAS, api_key=KEY)
    srv.key, srv.alias = KEY, ALIAS
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.close()


# Records each text the reply's element shows, so the test sees it grow piece by piece.
WATCH = """
const log = document.getElementById('log'); window.seen = [];
new MutationObserver(() => {
  const m = log.querySelectorAll('.msg.assistant .text');
  if (m.length) window.seen.push(m[m.length - 1].textContent);
}).observe(log, {childList: true, subtree: true, characterData: true});
"""


def _fill(browser, id_, text):
    el = browser.find_element("id", id_)
    el.clear()
    el.send_keys(text)


def _ask(browser, wait, text, n_replies):
    from selenium.webdriver.common.keys import Keys
    browser.find_element("id", "input").send_keys(text, Keys.ENTER)
    wait.until(lambda b: len(b.find_elements("css selector", ".msg.assistant[data-done]")) == n_replies)
    reply = browser.find_elements("css selector", ".msg.assistant")[-1]
    assert "error" not in reply.get_attribute("class"), reply.text
    return reply


def test_chat_page_in_chromium(browser, server, tmp_path):
    from selenium.webdriver.support.ui import WebDriverWait
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(server.url + "/")
    key = browser.find_element("id", "key")
    wait.until(lambda b: key.is_displayed())              # the server has a key: the page asks
    _fill(browser, "key", server.key + "\t")
    wait.until(lambda b: b.find_element("id", "model").text.startswith(server.alias))
    _fill(browser, "system", SYSTEM)
    _fill(browser, "temperature", "0")
    _fill(browser, "max-tokens", str(N))
    _fill(browser, "stop", "###")
    browser.execute_script(WATCH)

    first = _ask(browser, wait, "What is the capital of France?", 1)
    text1 = browser.execute_script("return window.lite.messages[1].content")
    assert text1 and first.find_element("class name", "text").text == text1.strip()
    grown = [s for s in dict.fromkeys(browser.execute_script("return window.seen")) if s]
    assert len(grown) > 1 and all(text1.startswith(s) for s in grown), grown    # streamed in pieces
    stats = first.find_element("class name", "stats").text
    assert re.search(r"\d+ tokens · \d+\.\d tokens/s", stats), stats
    p1 = int(first.get_attribute("data-prompt-tokens"))

    second = _ask(browser, wait, "And of Italy?", 2)
    sent = browser.execute_script("return window.lite.lastRequest")
    assert [(m["role"], m["content"]) for m in sent["messages"]] == [
        ("system", SYSTEM), ("user", "What is the capital of France?"), ("assistant", text1),
        ("user", "And of Italy?")]
    assert sent["stop"] == ["###"] and sent["temperature"] == 0 and sent["max_tokens"] == N
    assert sent["stream"] is True
    assert int(second.get_attribute("data-prompt-tokens")) > p1     # the first exchange went along
    out = Path(os.environ.get("TEST_ARTIFACTS_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(out / "webui_chat.png"))

    browser.find_element("id", "new-chat").click()
    assert browser.execute_script("return window.lite.messages.length") == 0
    assert not browser.find_elements("css selector", ".msg")
