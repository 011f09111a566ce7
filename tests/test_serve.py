"Tests of coa_lib.serve: a real server on a free loopback port, queried with the official openai client."
import json
import os
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

from coa_lib.llm import BackendError, OpenAIBackend, build_tiny_qwen2, build_tokenizer, load_policy
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


def test_huge_max_tokens_is_capped(oc):
    r = oc.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=10**9, temperature=0)
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
