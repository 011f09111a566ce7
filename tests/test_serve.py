"Tests of coa_lib.serve: a real server on a free loopback port, queried with the official openai client."
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
import torch

from coa_lib.llm import BackendError, build_tiny_qwen2, load_policy, OpenAIBackend
from coa_lib.tokenizer import build_tokenizer
from coa_lib.serve import ServeConfig, serve

MODEL_ID = "tiny-coa"
TEXT = ("<think>Find the director.</think>\n<web_search>director of Blue Harbor</web_search>\n"
        "<answer>Ana Vell</answer> Ana Vell (born 1961) is a film director from Orsk.")
PROMPT = "Who directed Blue Harbor?"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    tok = build_tokenizer([TEXT] * 30, vocab_size=400)
    build_tiny_qwen2(tok, "nano", init_std=0.2).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def server(model_dir):
    srv = serve(model_dir, model_id=MODEL_ID, config=ServeConfig(max_tokens_cap=12))
    yield srv
    srv.shutdown()


@pytest.fixture(scope="module")
def oc(server):
    return openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def local(model_dir):
    return load_policy(model_dir)


def _post(url, data: bytes, headers=None):
    req = urllib.request.Request(url, data=data, headers=headers or {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_binds_loopback_and_lists_model(server, oc):
    assert server.server_address[0] == "127.0.0.1" and server.url.startswith("http://127.0.0.1:")
    assert [m.id for m in oc.models.list().data] == [MODEL_ID]
    assert oc.models.retrieve(MODEL_ID).id == MODEL_ID


def test_completions_match_local_backend(oc, local):
    r = oc.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=8, temperature=0)
    c = local.generate([PROMPT], max_new_tokens=8)[0]
    assert r.choices[0].text == c.text
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (c.prompt_tokens, c.completion_tokens)
    assert r.usage.total_tokens == c.prompt_tokens + c.completion_tokens
    assert r.model == MODEL_ID and r.object == "text_completion"


def test_completions_stop_and_n2(oc, local):
    free = local.generate([PROMPT], max_new_tokens=10)[0].text
    stop = free[4:7]
    r = oc.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=10, temperature=0, n=2, stop=[stop, "</answer>"])
    assert len(r.choices) == 2
    for ch in r.choices:
        assert ch.text == free[:free.find(stop)] and stop not in ch.text
        assert ch.finish_reason == "stop" and ch.model_extra["stop_reason"] == stop
    prompt_tokens = local.generate([PROMPT], max_new_tokens=0)[0].prompt_tokens
    assert r.usage.prompt_tokens == prompt_tokens                     # the prompt counted once, not per choice
    assert r.usage.completion_tokens == 2 * local.generate([PROMPT], stop=[stop], max_new_tokens=10)[0].completion_tokens


def test_sampling_n2_seeded(oc):
    kw = dict(model=MODEL_ID, prompt=PROMPT, max_tokens=8, temperature=1.0, n=2, seed=11)
    a, b = oc.completions.create(**kw), oc.completions.create(**kw)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert a.choices[0].text != a.choices[1].text                      # two samples, not one copied
    assert 2 <= a.usage.completion_tokens <= 16


def test_list_of_prompts_indexes(oc, local):
    r = oc.completions.create(model=MODEL_ID, prompt=["a", PROMPT], max_tokens=4, temperature=0, n=2)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    want = local.generate(["a", PROMPT], max_new_tokens=4)
    assert [c.text for c in r.choices] == [want[0].text, want[0].text, want[1].text, want[1].text]


def test_huge_max_tokens_is_capped(oc, server):
    # above the server's cap (12) but within the model's context: lowered to the cap (10**9, past the context, is a 400 below)
    assert server.config.max_context == 4096 > 1000
    r = oc.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=1000, temperature=0)
    assert r.usage.completion_tokens <= 12 and r.choices[0].finish_reason in ("length", "stop")


def test_chat_completions(oc, server, model_dir):
    r = oc.chat.completions.create(model=MODEL_ID, messages=[{"role": "system", "content": "S"},
                                                             {"role": "user", "content": PROMPT}],
                                   max_tokens=6, temperature=0)
    chat_local = load_policy(model_dir, chat=True, system="S").generate([PROMPT], max_new_tokens=6)[0]
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == chat_local.text
    assert r.usage.prompt_tokens == chat_local.prompt_tokens
    be = OpenAIBackend(server.url, MODEL_ID, chat=True)
    c = be.generate([PROMPT], max_new_tokens=6, temperature=0)[0]
    assert c.prompt_tokens == load_policy(model_dir, chat=True).generate([PROMPT], max_new_tokens=0)[0].prompt_tokens


def test_openai_backend_against_server(server, local):
    be = OpenAIBackend(server.url, MODEL_ID, timeout=60)
    free = local.generate([PROMPT, "x"], max_new_tokens=10)
    stop = free[0].text[2:5]
    got = be.generate([PROMPT, "x"], stop=[stop], max_new_tokens=10)
    want = local.generate([PROMPT, "x"], stop=[stop], max_new_tokens=10)
    assert got == want
    assert got[0].finish_reason == "stop" and got[0].stop == stop


@pytest.mark.parametrize("body,param", [
    (b"{not json", None), (b"[1, 2]", None), (b'{"model": "tiny-coa"}', "prompt"),
    (b'{"prompt": "x", "max_tokens": "lots"}', "max_tokens"), (b'{"prompt": "x", "n": 99}', "n"),
    (b'{"prompt": "x", "stop": 5}', "stop"), (b'{"prompt": "x", "stream": true}', "stream"),
    (b'{"prompt": "x", "temperature": -1}', "temperature"), (b'{"prompt": [1, 2, 3]}', "prompt"),
    (b'\xff\xfe', None)])
def test_bad_requests_get_400(server, body, param):
    status, err = _post(server.url + "/completions", body)
    assert status == 400
    assert err["error"]["type"] == "invalid_request_error" and err["error"]["param"] == param
    assert isinstance(err["error"]["message"], str) and err["error"]["message"]


def test_bad_chat_request_and_official_client_error(server, oc):
    status, err = _post(server.url + "/chat/completions", json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode())
    assert status == 400 and err["error"]["param"] == "messages[0].role"
    with pytest.raises(openai.BadRequestError) as e:
        oc.chat.completions.create(model=MODEL_ID, messages=[], max_tokens=2)
    assert e.value.status_code == 400


def test_unknown_model_path_and_size(server):
    status, err = _post(server.url + "/completions", b'{"model": "gpt-9", "prompt": "x"}')
    assert status == 404 and err["error"]["code"] == "model_not_found"
    status, err = _post(server.url + "/nothing", b"{}")
    assert status == 404
    with pytest.raises(BackendError, match="HTTP 404"):
        OpenAIBackend(server.url, "gpt-9", max_retries=3, backoff_s=0.01).generate(["x"])
    big = b'{"prompt": "' + b"a" * (server.config.max_body_bytes + 10) + b'"}'
    try:
        status, err = _post(server.url + "/completions", big)
        assert status == 413
    except (ConnectionError, urllib.error.URLError):   # the server may close before the client finished sending
        pass
    assert _post(server.url + "/completions", b'{"prompt": "x", "max_tokens": 1}')[0] == 200   # still serving


def test_concurrent_requests_are_serialised(server, local):
    want = local.generate([PROMPT], max_new_tokens=6)[0].text
    results, errors = [], []
    def ask():
        try:
            results.append(OpenAIBackend(server.url, MODEL_ID).generate([PROMPT], max_new_tokens=6)[0].text)
        except Exception as e:  # collected and asserted below
            errors.append(e)
    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads: t.start()
    for t in threads: t.join(60)
    assert not errors and results == [want] * 4


def test_shutdown_frees_the_port(model_dir):
    srv = serve(model_dir)
    url, port = srv.url, srv.server_address[1]
    assert srv.model_id == str(model_dir)
    srv.shutdown()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0   # nothing listening: the connection is refused
    with pytest.raises(BackendError):
        OpenAIBackend(url, str(model_dir), timeout=2, max_retries=0).generate(["x"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_module_serves(model_dir):
    port = _free_port()
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "coa_lib.serve", "--model", str(model_dir), "--port", str(port),
                             "--model-id", "cli-model", "--quiet"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        oc = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=10)
        deadline = time.time() + 90
        while True:
            try:
                assert [m.id for m in oc.models.list().data] == ["cli-model"]
                break
            except openai.APIConnectionError:
                assert proc.poll() is None, proc.stdout.read()
                assert time.time() < deadline, "server did not come up"
                time.sleep(0.3)
        r = oc.completions.create(model="cli-model", prompt=PROMPT, max_tokens=3, temperature=0)
        assert r.usage.completion_tokens <= 3
    finally:
        proc.terminate()
        try: proc.wait(10)
        except subprocess.TimeoutExpired: proc.kill(); proc.wait()


# --- under load: many concurrent official clients; hostile requests ---------------------------------------------------

def test_fifty_concurrent_openai_clients(server, model_dir, local):
    """50 official clients at once, 3 requests each (completions, chat, completions n=2): no failure, every answer
    well-formed, and each the greedy text of its own prompt (no answer crosses to another client). The stdlib's listen
    backlog of 5 failed this (10-24 of 150 APIConnectionError in 3 of 4 runs)."""
    clients, per_client, mt = 50, 3, 4
    chat_local = load_policy(model_dir, chat=True)
    prompt = lambda i, j: f"Client {i} question {j}: who directed Blue Harbor?"
    want = {}
    for i in range(clients):
        for j in range(per_client):
            be = chat_local if j == 1 else local
            want[i, j] = be.generate([prompt(i, j)], max_new_tokens=mt)[0]
    results, errors, spans = {}, [], []
    barrier = threading.Barrier(clients)

    def client(i):
        c = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=120)   # no retries: nothing hidden
        barrier.wait(60)
        for j in range(per_client):
            t0 = time.perf_counter()
            try:
                if j == 1:
                    r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": prompt(i, j)}],
                                                  max_tokens=mt, temperature=0)
                else:
                    r = c.completions.create(model=MODEL_ID, prompt=prompt(i, j), max_tokens=mt, temperature=0,
                                             n=2 if j == 2 else 1)
                results[i, j] = r
            except Exception as e:  # collected and asserted below
                errors.append((i, j, repr(e)))
            spans.append((t0, time.perf_counter()))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads: t.start()
    for t in threads: t.join(300)
    wall = time.perf_counter() - t0
    assert not any(t.is_alive() for t in threads), "a client hung"
    assert not errors, f"{len(errors)} failed, e.g. {errors[:3]}"
    assert len(results) == clients * per_client
    ids = set()
    for (i, j), r in results.items():
        w, n, chat = want[i, j], (2 if j == 2 else 1), j == 1
        assert r.object == ("chat.completion" if chat else "text_completion") and r.model == MODEL_ID
        assert r.id.startswith("chatcmpl-" if chat else "cmpl-") and r.id not in ids
        ids.add(r.id)
        assert [c.index for c in r.choices] == list(range(n))
        for ch in r.choices:
            text = ch.message.content if chat else ch.text
            assert text == w.text, (i, j, text, w.text)
            assert ch.finish_reason == ("length" if w.finish_reason == "length" else "stop")
            if chat: assert ch.message.role == "assistant"
        assert r.usage.prompt_tokens == w.prompt_tokens
        assert r.usage.completion_tokens == n * w.completion_tokens <= n * mt
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # the requests really overlapped: at the busiest moment most clients were waiting on the server together
    peak = max(sum(a <= t < b for a, b in spans) for t, _ in spans)
    assert peak >= 20, peak
    print(f"{len(results)} requests from {clients} clients in {wall:.1f} s, peak {peak} in flight")


def _raw(port: int, request: bytes, timeout: float = 60, half_close: bool = False):
    "Send raw bytes; return (status, headers, body bytes, seconds). Reads until the server closes."
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        if half_close: s.shutdown(socket.SHUT_WR)
        data = b""
        try:
            while chunk := s.recv(65536): data += chunk
        except ConnectionResetError:   # the server closed with part of the request unread, after its answer
            if not data: raise
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(l.split(": ", 1) for l in lines[1:] if ": " in l)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body, time.perf_counter() - t0


def _http(method: str, path: str, body: bytes = b"", content_type: str | None = "application/json",
          length: int | str | None = "auto") -> bytes:
    h = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    if content_type is not None: h.append(f"Content-Type: {content_type}")
    if length is not None: h.append(f"Content-Length: {len(body) if length == 'auto' else length}")
    return ("\r\n".join(h) + "\r\n\r\n").encode() + body


_C, _CC = "/v1/completions", "/v1/chat/completions"
_J = lambda **kw: json.dumps(kw).encode()
# name -> (raw request, expected status, expected param, a word the message must contain, expected code)
HOSTILE = {
    "malformed JSON": (_http("POST", _C, b'{"prompt": "x",'), 400, None, "JSON", None),
    "JSON not an object": (_http("POST", _C, b'"just a string"'), 400, None, "object", None),
    "empty body": (_http("POST", _C, b""), 400, None, "JSON", None),
    "missing prompt": (_http("POST", _C, _J(model=MODEL_ID, max_tokens=2)), 400, "prompt", "prompt", None),
    "missing messages": (_http("POST", _CC, _J(model=MODEL_ID, max_tokens=2)), 400, "messages", "messages", None),
    "max_tokens 10**9": (_http("POST", _C, _J(prompt="x", max_tokens=10**9)), 400, "max_tokens", "max_tokens", None),
    "max_tokens negative": (_http("POST", _C, _J(prompt="x", max_tokens=-1)), 400, "max_tokens", "max_tokens", None),
    "max_tokens float": (_http("POST", _C, _J(prompt="x", max_tokens=2.5)), 400, "max_tokens", "max_tokens", None),
    "max_tokens string": (_http("POST", _C, _J(prompt="x", max_tokens="5")), 400, "max_tokens", "max_tokens", None),
    "max_tokens 5000 digits": (_http("POST", _C, b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}"), 400, None, "JSON",
                               None),
    "chat max_tokens 10**9": (_http("POST", _CC, _J(messages=[{"role": "user", "content": "x"}], max_tokens=10**9)), 400,
                              "max_tokens", "max_tokens", None),
    "n 1000": (_http("POST", _C, _J(prompt="x", n=1000)), 400, "n", "'n'", None),
    "n string": (_http("POST", _C, _J(prompt="x", n="2")), 400, "n", "'n'", None),
    "temperature string": (_http("POST", _C, _J(prompt="x", temperature="0.5")), 400, "temperature", "temperature", None),
    "temperature NaN": (_http("POST", _C, b'{"prompt": "x", "temperature": NaN}'), 400, "temperature", "temperature", None),
    "seed string": (_http("POST", _C, _J(prompt="x", seed="7")), 400, "seed", "seed", None),
    "seed 2**64": (_http("POST", _C, _J(prompt="x", max_tokens=1, seed=2**64)), 400, "seed", "seed", None),
    "stop number": (_http("POST", _C, _J(prompt="x", stop=5)), 400, "stop", "stop", None),
    "stream": (_http("POST", _C, _J(prompt="x", stream=True)), 400, "stream", "stream", None),
    "chat stream": (_http("POST", _CC, _J(messages=[{"role": "user", "content": "x"}], stream=True)), 400, "stream",
                    "stream", None),
    "unknown model": (_http("POST", _C, _J(model="gpt-9", prompt="x")), 404, "model", "gpt-9", "model_not_found"),
    "1 MB prompt": (_http("POST", _C, _J(prompt="Ana Vell " * 116_000, max_tokens=2)), 400, "prompt", "context",
                    "context_length_exceeded"),
    "1 MB chat message": (_http("POST", _CC, _J(messages=[{"role": "user", "content": "a" * 1_000_000}])), 400, "messages",
                          "context", "context_length_exceeded"),
    "invalid UTF-8": (_http("POST", _C, b'{"prompt": "\xc3\x28 \xff"}'), 400, None, "JSON", None),
    "nested 100k deep": (_http("POST", _C, b"[" * 100_000 + b"]" * 100_000), 400, None, "JSON", None),
    "text/plain": (_http("POST", _C, _J(prompt="x", max_tokens=1), content_type="text/plain"), 415, None,
                   "application/json", None),
    "form encoded": (_http("POST", _C, b"prompt=x", content_type="application/x-www-form-urlencoded"), 415, None,
                     "application/json", None),
    "no Content-Length": (_http("POST", _C, _J(prompt="x"), length=None), 411, None, "Content-Length", None),
    "Content-Length 10**12": (_http("POST", _C, _J(prompt="x"), length=10**12), 413, None, "bytes", None),
    "Content-Length not a number": (_http("POST", _C, _J(prompt="x"), length="lots"), 411, None, "Content-Length", None),
    "PUT": (_http("PUT", _C, _J(prompt="x")), 405, None, "PUT", "method_not_allowed"),
    # errors the stdlib raises before any handler runs: JSON too
    "header line of 70 kB": (b"GET /v1/models HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431, None, "too long",
                             None),
    "request line of 70 kB": (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414, None, "Too Long", None),
    # issue 27 item 22: text that is not Unicode (a JSON escape of half a surrogate pair) was a 500 from the tokenizer
    "lone surrogate prompt": (_http("POST", _C, b'{"prompt": "caf\\ud800", "max_tokens": 2}'), 400, "prompt", "surrogate", None),
    "lone surrogate in a list": (_http("POST", _C, b'{"prompt": ["ok", "\\udfff"], "max_tokens": 2}'), 400, "prompt", "surrogate",
                                 None),
    "lone surrogate stop": (_http("POST", _C, b'{"prompt": "x", "stop": "\\ud800"}'), 400, "stop", "surrogate", None),
    "lone surrogate message": (_http("POST", _CC, b'{"messages": [{"role": "user", "content": "\\ud800"}]}'), 400,
                               "messages[0].content", "surrogate", None),
    # body framing: two Content-Lengths that disagree (was: the first one won), chunked bodies, a length that int() reads
    "two Content-Lengths": (_http("POST", _C, _J(prompt="x", max_tokens=1)).replace(b"Content-Length", b"Content-Length: 2\r\n"
                            b"Content-Length", 1), 400, None, "conflicting Content-Length", None),
    "Transfer-Encoding": (_http("POST", _C, _J(prompt="x")).replace(b"Host:", b"Transfer-Encoding: chunked\r\nHost:"), 400, None,
                          "Transfer-Encoding", None),
    "Content-Length 1_5": (_http("POST", _C, b'{"prompt": "x"}', length="1_5"), 411, None, "Content-Length", None),
    "Content-Length 5000 digits": (_http("POST", _C, _J(prompt="x"), length="9" * 5000), 413, None, "bytes", None),
    # not HTTP/1.x: each was answered with a bare JSON body (no status line) or, for HTTP/0.9, not at all
    "HTTP/0.9": (b"GET /v1/models\r\n", 400, None, "HTTP/0.9", None),
    "garbage bytes (a TLS hello)": (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\x00\xff\r\n\r\n", 400, None,
                                    "request line", None),
    "one word": (b"hello\r\n\r\n", 400, None, "request line", None),
    "bad version": (b"GET /v1/models HTTP/1.x\r\n\r\n", 400, None, "version", None),
    "NUL in the method": (b"G\x00T /v1/models HTTP/1.1\r\n\r\n", 400, None, "request line", None),
    # the work one request may ask for is bounded: 64 prompts x n=8 held every other client for 20 s
    "64 prompts x n=8": (_http("POST", _C, _J(prompt=["x"] * 64, n=8, max_tokens=1)), 400, "n", "completions",
                         "request_too_large"),
    "16 prompts x 12 tokens": (_http("POST", _C, _J(prompt=["x"] * 16, max_tokens=12)), 400, "prompt", "new tokens",
                               "request_too_large"),
}


def test_hostile_requests_get_4xx_json_and_server_survives(model_dir):
    "Each hostile request gets its 4xx with an OpenAI-style JSON error naming the field, quickly; then the server still serves."
    srv = serve(model_dir, model_id=MODEL_ID, config=ServeConfig(max_tokens_cap=12, read_timeout_s=1.5, max_request_tokens=100))
    port = srv.server_address[1]
    try:
        for name, (request, status, param, word, code) in HOSTILE.items():
            got, headers, body, secs = _raw(port, request)
            assert got == status, (name, got, body[:300])
            assert headers.get("content-type") == "application/json", (name, headers)
            err = json.loads(body)["error"]
            assert err["type"] == "invalid_request_error" and err["param"] == param and err["code"] == code, (name, err)
            assert isinstance(err["message"], str) and word in err["message"], (name, err["message"])
            assert secs < 20, (name, secs)                                   # answered, not hung
        # a body shorter than its Content-Length: 408 after the read timeout, not a thread waiting for ever; and while
        # that client waits, others are served
        slow = {}
        t = threading.Thread(target=lambda: slow.update(r=_raw(port, _http("POST", _C, b'{"prompt": "x"}', length=1000))))
        t.start()
        time.sleep(0.2)
        oc = openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0, timeout=30)
        assert oc.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=2, temperature=0).usage.completion_tokens <= 2
        t.join(30)
        status, headers, body, secs = slow["r"]
        assert status == 408 and "Content-Length" in json.loads(body)["error"]["message"] and 1.4 < secs < 15, (status, secs)
        # a client that sends part of its body and closes its side: 400 at once, not 408
        status, _, body, secs = _raw(port, _http("POST", _C, b'{"prompt": "x"}', length=1000), half_close=True)
        assert status == 400 and "ended after 15 of" in json.loads(body)["error"]["message"] and secs < 1.4
        # still serving: a normal request of each kind, and the server thread is alive
        assert srv.thread.is_alive()
        r = oc.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=3, temperature=0)
        assert r.choices[0].text and r.usage.completion_tokens <= 3
        r = oc.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": PROMPT}], max_tokens=3)
        assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens <= 3
        assert [m.id for m in oc.models.list().data] == [MODEL_ID]
    finally:
        srv.shutdown()


def test_prompt_near_the_context_lowers_max_tokens(model_dir, local):
    "A prompt that fits but leaves less room than max_tokens: max_tokens is lowered to the room left; one that does not fit: 400."
    prompt = "Ana Vell " * 9
    free = local.generate([prompt], max_new_tokens=12)[0]
    assert free.completion_tokens > 5                              # unbounded, the model writes more than the room below
    srv = serve(model_dir, model_id=MODEL_ID, config=ServeConfig(max_tokens_cap=12, max_context=free.prompt_tokens + 5))
    try:
        oc = openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0, timeout=60)
        r = oc.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=12, temperature=0)
        assert r.usage.prompt_tokens == free.prompt_tokens and r.usage.completion_tokens == 5
        assert r.choices[0].finish_reason == "length" and r.choices[0].text == local.generate([prompt], max_new_tokens=5)[0].text
        with pytest.raises(openai.BadRequestError) as e:
            oc.completions.create(model=MODEL_ID, prompt=prompt * 2, max_tokens=1)
        assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "prompt"
        with pytest.raises(openai.BadRequestError) as e:
            oc.completions.create(model=MODEL_ID, prompt="x", max_tokens=free.prompt_tokens + 6)
        assert e.value.body["param"] == "max_tokens"
    finally:
        srv.shutdown()


def test_http09_and_garbage_are_answered_at_once(server):
    "Not HTTP/1.x: a 400 with a status line, headers and a JSON body at once, not after the read timeout (30 s here)."
    assert server.config.read_timeout_s == 30
    for request in (b"GET /v1/models\r\n", b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n", b"hello\r\n"):
        status, headers, body, _ = _raw(server.server_address[1], request, timeout=10)   # the old server: 30 s, or no status line
        assert status == 400 and headers["content-type"] == "application/json", (request, status, headers)
        assert "request line" in json.loads(body)["error"]["message"]


def _trickle(port: int, head: bytes, slow: bytes, gap: float = 0.05) -> tuple[int, bytes]:
    "Send `head`, then `slow` a byte every `gap` s until the server answers or closes: (bytes of `slow` sent, the reply)."
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head)
        sent = 0
        while sent < len(slow) and not select.select([s], [], [], gap)[0]:
            try: s.sendall(slow[sent:sent + 1])
            except (BrokenPipeError, ConnectionResetError): break
            sent += 1
        data = b""
        try:
            while chunk := s.recv(65536): data += chunk
        except ConnectionResetError:
            pass
    return sent, data


def _handler_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if "process_request_thread" in t.name]


def test_a_trickling_client_is_cut_off(model_dir):
    """A client that sends its request one byte at a time (each byte well within the socket timeout) kept a thread for as
    long as it liked: the whole request must arrive within read_timeout_s, or the server answers 408 (or, inside the
    request line, closes) and the thread ends."""
    srv = serve(model_dir, model_id=MODEL_ID, config=ServeConfig(max_tokens_cap=12, read_timeout_s=1.0))
    port, line = srv.server_address[1], b"POST /v1/completions HTTP/1.1\r\n"
    headers = b"Host: x\r\nContent-Type: application/json\r\nX-Pad: " + b"a" * 400 + b"\r\n"
    body = json.dumps({"prompt": "x " * 200, "max_tokens": 1}).encode()
    try:
        sent, reply = _trickle(port, b"", line + headers + b"\r\n")               # inside the request line: closed
        assert sent < len(line) + len(headers) and reply == b"", (sent, reply[:200])
        sent, reply = _trickle(port, line, headers + b"\r\n")                      # inside the headers: 408
        assert sent < len(headers) and reply.startswith(b"HTTP/1.0 408 "), (sent, reply[:200])
        assert "headers did not arrive" in json.loads(reply.partition(b"\r\n\r\n")[2])["error"]["message"]
        head = line + headers + f"Content-Length: {len(body)}\r\n\r\n".encode()
        sent, reply = _trickle(port, head, body)                                     # inside the body: 408
        assert sent < len(body) and reply.startswith(b"HTTP/1.0 408 "), (sent, reply[:200])
        assert "Content-Length" in json.loads(reply.partition(b"\r\n\r\n")[2])["error"]["message"]
        deadline = time.monotonic() + 10
        while _handler_threads() and time.monotonic() < deadline: time.sleep(0.05)
        assert not _handler_threads(), _handler_threads()                           # no thread left waiting on a client
        assert _raw(port, _http("POST", _C, _J(prompt="x", max_tokens=1)))[0] == 200  # and the server still serves
    finally:
        srv.shutdown()
