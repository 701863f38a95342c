"""The console in a real browser: Debian's chromium, headless, driven by Selenium (which uses the
system chromedriver; nothing downloads a browser), against a real server with token auth on.

One server and one browser for the module: an echo model, the pretrained EfficientNet-Lite0
classifier (examples/image_classifier) and a tiny ``text_generation`` model built in code. A
screenshot of each view is kept: under ``$LANTERN_ARTIFACTS/console`` when that is set, else a
pytest temporary folder (path printed).

One chat test drives the page's streaming logic against a fake ``/v1/chat/completions`` SSE
endpoint installed in the page (a ``fetch`` stand-in returning a stream the test releases in
steps, so that the first tokens are seen before the rest); another chats with the tiny model
through the server's own OpenAI route and receives its whole answer.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.server import DATA, REPO, LanternServer, build_archive, echo_archive

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CAT_CLASSES = range(281, 286)  # tabby, tiger cat, Persian cat, Siamese cat, Egyptian cat
CLASSIFIER = "efficientnet_lite0"


def _cat_labels() -> set[str]:
    raw = json.loads((DATA / "index_to_name.json").read_text())
    return {raw[str(i)][-1] for i in CAT_CLASSES}


def _browser_binaries() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium and driver:
        return chromium, driver
    if os.environ.get("CI"):
        pytest.fail("chromium is missing: .ci/run installs Debian's chromium and chromium-driver")
    pytest.skip("Debian's chromium and chromium-driver are not installed (apt-get install them)")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = os.environ.get("LANTERN_ARTIFACTS")
    folder = Path(root) / "console" if root else tmp_path_factory.mktemp("console-screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nconsole screenshots: {folder}")
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    _browser_binaries()  # skip before building anything
    work = tmp_path_factory.mktemp("console")
    build = REPO / "examples" / "image_classifier" / "build.py"
    done = subprocess.run([sys.executable, str(build)], cwd=work, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    store = work / "model_store"
    echo_archive(store, config={"minWorkers": 1})
    _tiny_llm_archive(work, store)
    models = ["echo=echo.mar", f"{CLASSIFIER}={CLASSIFIER}.mar", f"{LLM}={LLM}.mar"]
    with LanternServer(work, store, models, token_auth=True) as srv:
        yield srv


LLM = "tiny-llm"
LLM_MODEL_LEN = 64  # short answers: a chat's default length is the rest of this context
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _tiny_llm_archive(work: Path, store: Path) -> None:
    from tests.support.generation_fixtures import save_pretrained

    folder = work / "tiny-llm"
    _, tokenizer = save_pretrained(folder)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    build_archive(
        store,
        LLM,
        "text_generation",
        config={"minWorkers": 1, "handler": {"max_model_len": LLM_MODEL_LEN}},
        extra_files=sorted(folder.iterdir()),
    )


@pytest.fixture(scope="module")
def keys(server: LanternServer) -> dict[str, str]:
    return {kind: entry["key"] for kind, entry in server.keys().items()}


@pytest.fixture(scope="module")
def browser(server: LanternServer) -> Iterator[Any]:
    chromium, driver_path = _browser_binaries()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_argument("--window-size=1280,900")
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(driver_path))
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver: Any, condition: Callable[[Any], Any], timeout: float = 60.0) -> Any:
    # The page re-renders its tables as it polls: an element read a moment ago may be replaced.
    return WebDriverWait(
        driver, timeout, poll_frequency=0.1, ignored_exceptions=[StaleElementReferenceException]
    ).until(condition)


def open_console(driver: Any, server: LanternServer, keys: dict[str, str] | None) -> None:
    driver.get(f"{server.management}/console/")
    wait(driver, lambda d: d.execute_script("return !!window.lantern"))
    if keys is not None:
        driver.find_element(By.ID, "mgmt-token").send_keys(keys["management"])
        driver.find_element(By.ID, "inf-token").send_keys(keys["inference"])
        driver.find_element(By.ID, "save-tokens").click()


def text(driver: Any, selector: str) -> str:
    """The element's text, read again if a re-render replaced it between finding and reading."""
    for _ in range(20):
        try:
            return str(driver.find_element(By.CSS_SELECTOR, selector).text)
        except StaleElementReferenceException:
            continue
    return str(driver.find_element(By.CSS_SELECTOR, selector).text)


def confirm(driver: Any) -> None:
    wait(driver, lambda d: d.find_element(By.ID, "confirm").is_displayed())
    driver.find_element(By.ID, "confirm-ok").click()


def management(server: LanternServer, keys: dict[str, str], path: str) -> Any:
    auth = {"authorization": f"Bearer {keys['management']}"}
    return httpx.get(f"{server.management}{path}", headers=auth, timeout=30).json()


def ready_workers(server: LanternServer, keys: dict[str, str], model: str) -> int:
    described = management(server, keys, f"/models/{model}")[0]
    return sum(w["status"] == "READY" for w in described["workers"])


def test_a_page_without_a_token_changes_nothing(
    browser: Any, server: LanternServer, keys: dict[str, str], artifacts: Path
) -> None:
    open_console(browser, server, None)
    wait(browser, lambda d: "401" in text(d, "#notice"))
    assert browser.find_elements(By.CSS_SELECTOR, "tr.version") == []
    assert keys["management"] not in browser.page_source  # the page embeds no token
    before = management(server, keys, "/models/echo")[0]
    browser.find_element(By.ID, "register-url").send_keys("echo.mar")
    browser.find_element(By.ID, "register-btn").click()
    confirm(browser)
    wait(browser, lambda d: "401" in text(d, "#notice"))
    answers = browser.execute_async_script(
        """const done = arguments[arguments.length - 1];
        const calls = [["PUT", "/models/echo?min_worker=3&synchronous=true"],
                       ["PUT", "/models/echo/1.0/set-default"], ["DELETE", "/models/echo/1.0"],
                       ["POST", "/console/inference/predictions/echo"]];
        Promise.all(calls.map(([m, p]) => fetch(p, {method: m}).then(r => r.status))).then(done);"""
    )
    assert answers == [401, 401, 401, 401]
    after = management(server, keys, "/models/echo")[0]
    assert len(after["workers"]) == len(before["workers"]) == 1
    assert [m["modelName"] for m in management(server, keys, "/models")["models"]] == [
        "echo",
        CLASSIFIER,
        LLM,
    ]
    browser.save_screenshot(str(artifacts / "no-token.png"))


def test_models_render_and_scaling_takes_effect(
    browser: Any, server: LanternServer, keys: dict[str, str], artifacts: Path
) -> None:
    open_console(browser, server, keys)
    row = 'tr.version[data-model="echo"]'
    wait(browser, lambda d: "READY" in text(d, row))
    assert "(default)" in text(browser, row)
    assert "pid" in text(browser, row) and "MB" in text(browser, row)
    wait(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, f'tr.version[data-model="{CLASSIFIER}"]'),
    )
    scale = browser.find_element(By.CSS_SELECTOR, f"{row} .scale-input")
    scale.clear()
    scale.send_keys("2")
    browser.find_element(By.CSS_SELECTOR, f"{row} .scale-btn").click()
    confirm(browser)
    wait(browser, lambda d: text(d, row).count("READY") == 2, timeout=120)
    assert ready_workers(server, keys, "echo") == 2
    for _ in range(5):  # traffic for the rate table
        httpx.post(
            f"{server.inference}/predictions/echo",
            content=b"{}",
            headers={"authorization": f"Bearer {keys['inference']}"},
        )
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, '#stats tr[data-model="echo"]'))
    browser.save_screenshot(str(artifacts / "models.png"))


def test_try_it_shows_the_kittens_top_label(
    browser: Any, server: LanternServer, keys: dict[str, str], artifacts: Path
) -> None:
    open_console(browser, server, keys)
    browser.find_element(By.CSS_SELECTOR, 'nav button[data-view="try"]').click()
    option = f'#try-model option[value="{CLASSIFIER}"]'
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, option))
    browser.find_element(By.CSS_SELECTOR, option).click()
    wait(browser, lambda d: ready_workers(server, keys, CLASSIFIER) > 0, timeout=180)
    browser.find_element(By.ID, "try-file").send_keys(str(DATA / "kitten.jpg"))
    browser.find_element(By.ID, "try-send").click()
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#try-top li"), timeout=120)
    top = browser.find_element(By.CSS_SELECTOR, "#try-top li .label").text
    assert top in _cat_labels()
    assert text(browser, "#try-latency").startswith("200 in ")
    browser.save_screenshot(str(artifacts / "try-it.png"))


FAKE_SSE = """
window.__chat = {};
const realFetch = window.fetch;
window.fetch = (url, init) => {
  if (!String(url).endsWith('/v1/chat/completions')) return realFetch(url, init);
  const auth = init.headers.authorization;
  window.__chat.request = {url: String(url), body: JSON.parse(init.body), auth};
  const enc = new TextEncoder();
  const event = (text) => enc.encode('data: ' + JSON.stringify(
    {object: 'chat.completion.chunk', choices: [{index: 0, delta: {content: text}}]}) + '\\n\\n');
  let release;
  const gate = new Promise(r => { release = r; });
  window.__chat.release = release;
  const body = new ReadableStream({async start(c) {
    c.enqueue(event('Hel')); c.enqueue(event('lo'));
    await gate;
    c.enqueue(enc.encode('data: ' + JSON.stringify({choices: [{delta: {content: ', cat'}}]})));
    c.enqueue(enc.encode('\\n\\ndata: [DONE]\\n\\n')); c.close();
  }});
  return Promise.resolve(new Response(body, {headers: {'content-type': 'text/event-stream'}}));
};
"""


def test_chat_streams_tokens_as_they_arrive(
    browser: Any, server: LanternServer, keys: dict[str, str], artifacts: Path
) -> None:
    open_console(browser, server, keys)
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "tr.version"))
    assert browser.execute_script("return lantern.isGenerative({generative: true})")
    assert not browser.execute_script("return lantern.isGenerative({generative: false})")
    browser.execute_script(FAKE_SSE + "lantern.enableChat(['tiny-llm']); lantern.show('chat');")
    browser.find_element(By.ID, "chat-input").send_keys("hi")
    browser.find_element(By.ID, "chat-send").click()
    reply = "#chat-log .msg.assistant"
    wait(browser, lambda d: text(d, reply) == "Hello")  # the first tokens, before the rest
    assert "streaming" in browser.find_element(By.CSS_SELECTOR, reply).get_attribute("class")
    browser.save_screenshot(str(artifacts / "chat-streaming.png"))
    browser.execute_script("window.__chat.release()")
    wait(
        browser,
        lambda d: "streaming" not in d.find_element(By.CSS_SELECTOR, reply).get_attribute("class"),
    )
    assert text(browser, reply) == "Hello, cat"
    request = browser.execute_script("return window.__chat.request")
    assert request["url"].endswith("/console/inference/v1/chat/completions")
    assert request["body"] == {
        "model": "tiny-llm",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert request["auth"] == f"Bearer {keys['inference']}"
    browser.save_screenshot(str(artifacts / "chat-fake.png"))


def test_chat_with_a_text_generation_model_receives_a_whole_answer(
    browser: Any, server: LanternServer, keys: dict[str, str], artifacts: Path
) -> None:
    """Describe says which models generate; the chat tab shows for them alone, and a message
    gets the model's whole answer (its default length: the rest of the context, not 16)."""
    open_console(browser, server, keys)
    assert management(server, keys, f"/models/{LLM}")[0]["generative"] is True
    assert management(server, keys, "/models/echo")[0]["generative"] is False
    wait(browser, lambda d: d.find_element(By.ID, "nav-chat").is_displayed())
    options = browser.find_elements(By.CSS_SELECTOR, "#chat-model option")
    assert [o.get_attribute("value") for o in options] == [LLM]
    browser.find_element(By.ID, "nav-chat").click()
    browser.find_element(By.ID, "chat-input").send_keys("the quick brown fox")
    browser.find_element(By.ID, "chat-send").click()
    stats = "#chat-log .msg-stats"
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, stats), timeout=120)
    reply = browser.find_element(By.CSS_SELECTOR, "#chat-log .msg.assistant")
    assert "error" not in (reply.get_attribute("class") or ""), reply.text
    assert "streaming" not in (reply.get_attribute("class") or "")
    line = text(browser, stats)
    match = re.fullmatch(
        r"TTFT \d+ ms · (\d+) tokens( · [\d.]+ tokens/s)? · finish: (stop|length)", line
    )
    assert match, line
    tokens, finish = int(match.group(1)), match.group(3)
    assert reply.text.strip() and tokens >= 1
    if finish == "length":  # it ran to the end of the context, far past OpenAI's 16
        assert tokens > 16, line
    browser.save_screenshot(str(artifacts / "chat.png"))


def test_api_docs_send_a_request(
    browser: Any, server: LanternServer, keys: dict[str, str], artifacts: Path
) -> None:
    open_console(browser, server, keys)
    browser.find_element(By.CSS_SELECTOR, 'nav button[data-view="docs"]').click()
    route = '#docs [data-api="management"] details[data-route="GET /models/{model_name}"]'
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, route))
    browser.find_element(By.CSS_SELECTOR, f"{route} summary").click()
    # The route's form is built on the details' "toggle" event, a task after the click: wait.
    field = f'{route} input[name="model_name"]'
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, field))
    browser.find_element(By.CSS_SELECTOR, field).send_keys("echo")
    browser.find_element(By.CSS_SELECTOR, f"{route} button").click()
    wait(browser, lambda d: text(d, f"{route} pre.answer").startswith("200"))
    assert '"modelName": "echo"' in text(browser, f"{route} pre.answer")
    assert browser.find_elements(By.CSS_SELECTOR, '#docs [data-api="inference"] details.route')
    browser.save_screenshot(str(artifacts / "api-docs.png"))


def test_the_pages_own_arithmetic(browser: Any, server: LanternServer) -> None:
    """Percentiles as Prometheus's histogram_quantile computes them, rates between two scrapes,
    and SSE events split across network chunks."""
    open_console(browser, server, None)
    got = browser.execute_script(
        """const M = LanternMetrics;
        const text = (n, fast, slow) => [
          '# HELP serve_requests_total x',
          `serve_requests_total{model="m",status="200",version="1"} ${n}`,
          `serve_requests_total{model="m",status="503",version="1"} ${slow}`,
          `serve_request_duration_seconds_bucket{le="0.01",model="m",version="1"} ${fast}`,
          `serve_request_duration_seconds_bucket{le="0.1",model="m",version="1"} ${n + slow}`,
          `serve_request_duration_seconds_bucket{le="+Inf",model="m",version="1"} ${n + slow}`,
        ].join('\\n');
        const before = M.summarise(M.parse(text(10, 10, 0)));
        const after = M.summarise(M.parse(text(110, 60, 20)));
        const events = [];
        const feed = LanternChat.sseReader((d) => events.push(d));
        feed('data: {"a"'); feed(':1}\\n'); feed('\\ndata: [DONE]\\r\\n\\r\\n');
        return {q: M.quantile(0.5, {"0.1": 10, "0.2": 30, "+Inf": 30}),
                inf: M.quantile(0.99, {"1": 5, "+Inf": 10}),
                rows: M.between(before, after, 2), events,
                text: LanternChat.deltaText('{"choices":[{"delta":{"content":"hi"}}]}')};"""
    )
    assert got["q"] == pytest.approx(0.125)  # rank 15 of 30: a quarter into (0.1, 0.2]
    assert got["inf"] == 1  # in the +Inf bucket: the highest finite bound, as Prometheus
    row = got["rows"]["m"]
    assert row["rate"] == pytest.approx(60)  # (110 + 20 − 10) / 2 s
    assert row["errors"] == pytest.approx(10)
    # 120 new requests, 50 of them in 10 ms, 70 in (10, 100] ms: linear inside that bucket.
    assert row["p50"] == pytest.approx(10 + 90 * 10 / 70)
    assert row["p99"] == pytest.approx(10 + 90 * 68.8 / 70)
    assert got["events"] == ['{"a":1}', "[DONE]"]
    assert got["text"] == "hi"
