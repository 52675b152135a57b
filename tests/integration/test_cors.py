"""A page on another origin calls the shim with a token (issue 23, item 3): with `--cors-allow-origins` and
`--auth-keys`, a preflight asking for `authorization`, `x-request-id` and the OpenAI JS SDK's headers is
allowed, and the real call's answer exposes what the page reads (the request id, the tenant). Checked with
httpx and in a real browser: headless Chromium loads a page served on another port, which calls the shim
with fetch and writes what it read into the page."""

from __future__ import annotations

import hashlib
import http.server
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.processes import ServerProcess, ShimProcess, start_server, start_shim

TOKEN = "browser-secret-token"
CHROMIUM = shutil.which("chromium")


@pytest.fixture(scope="module")
def page_server() -> Iterator[http.server.ThreadingHTTPServer]:
    """The page's own origin: http://127.0.0.1:PORT, another port than the shim's."""
    folder = Path(tempfile.mkdtemp(prefix="sluice-page-"))

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(folder), **kwargs)  # type: ignore[arg-type]

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.folder = folder  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    shutil.rmtree(folder, ignore_errors=True)


def origin_of(httpd: http.server.ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}"


@pytest.fixture(scope="module")
def stack(
    page_server: http.server.ThreadingHTTPServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, ShimProcess]]:
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    keys.write_text(f'[[tenant]]\nname = "web"\ntoken_sha256 = "{digest}"\n')
    server = start_server("--models", "mlp,byte-lm", "--auth-keys", str(keys))
    shim = start_shim(server.target, "--auth-keys", str(keys), "--cors-allow-origins", origin_of(page_server))
    yield server, shim
    shim.terminate()
    assert server.terminate() == 0, server.diagnostics()


SDK_HEADERS = (
    "authorization, content-type, x-request-id, x-stainless-lang, x-stainless-retry-count, openai-project"
)


def test_a_preflight_with_a_token_and_a_real_call_from_an_allowed_origin(
    stack: tuple[ServerProcess, ShimProcess], page_server: http.server.ThreadingHTTPServer
) -> None:
    _, shim = stack
    origin = origin_of(page_server)
    preflight = httpx.options(
        f"{shim.url}/v1/chat/completions",
        headers={
            "origin": origin,
            "access-control-request-method": "POST",
            "access-control-request-headers": SDK_HEADERS,
        },
    )
    assert preflight.status_code == 200, preflight.text
    assert preflight.headers["access-control-allow-origin"] == origin
    allowed = {h.strip() for h in preflight.headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "x-request-id", "x-stainless-lang", "openai-project"} <= allowed
    # A header no client of the API sends stays refused, and so does another origin.
    odd = httpx.options(
        f"{shim.url}/v1/chat/completions",
        headers={"origin": origin, "access-control-request-method": "POST",
                 "access-control-request-headers": "x-something-else"},
    )  # fmt: skip
    assert odd.status_code == 400 and "headers" in odd.text
    other = httpx.options(
        f"{shim.url}/v1/models",
        headers={"origin": "http://elsewhere.example", "access-control-request-method": "GET"},
    )
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    answer = httpx.post(
        f"{shim.url}/v1/chat/completions",
        headers={"origin": origin, "authorization": f"Bearer {TOKEN}", "x-request-id": "page-1"},
        json={"model": "byte-lm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["access-control-allow-origin"] == origin
    exposed = {h.strip() for h in answer.headers["access-control-expose-headers"].split(",")}
    assert {"x-request-id", "x-sluice-tenant", "retry-after", "retry-after-ms"} <= exposed
    assert answer.headers["x-request-id"] == "page-1" and answer.headers["x-sluice-tenant"] == "web"


PAGE = """<!doctype html><html><body><pre id="out">pending</pre><script>
fetch("%(shim)s/v1/chat/completions", {
  method: "POST",
  headers: {"content-type": "application/json", "authorization": "Bearer %(token)s",
            "x-request-id": "from-the-page", "x-stainless-lang": "js"},
  body: JSON.stringify({model: "byte-lm", messages: [{role: "user", content: "hi"}], max_tokens: 4}),
}).then(async (r) => {
  const body = await r.json();
  document.getElementById("out").textContent = ["status=" + r.status,
    "request_id=" + r.headers.get("x-request-id"), "tenant=" + r.headers.get("x-sluice-tenant"),
    "object=" + body.object].join(" ");
}).catch((e) => { document.getElementById("out").textContent = "failed=" + e; });
</script></body></html>
"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium (Debian) is not installed")
def test_a_page_on_another_origin_calls_the_shim_in_a_real_browser(
    stack: tuple[ServerProcess, ShimProcess], page_server: http.server.ThreadingHTTPServer, tmp_path: Path
) -> None:
    _, shim = stack
    folder: Path = page_server.folder  # type: ignore[attr-defined]
    (folder / "page.html").write_text(PAGE % {"shim": shim.url, "token": TOKEN})
    assert CHROMIUM is not None
    dom = subprocess.run(
        [
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=20000", "--dump-dom",
            f"{origin_of(page_server)}/page.html",
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert "status=200 request_id=from-the-page tenant=web object=chat.completion" in dom.stdout, (
        dom.stdout[-2000:],
        dom.stderr[-2000:],
    )
