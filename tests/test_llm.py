"Tests of coa_lib.llm: stop semantics of every backend, left padding, seeds, the tokenizer, retries, the judge."
import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from hypothesis import given, settings, strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from coa_lib.format import STOP_STRINGS, format_observation, token_loss_mask
from coa_lib.format import find_stop
from coa_lib.llm import (Backend, BackendError, build_tiny_qwen2, Completion, HFBackend, JudgeError, llm_judge, load_policy, n_params, OpenAIBackend, parse_judgement, qwen2_config, QWEN2_SIZES, ScriptedBackend)
from coa_lib.tokenizer import apply_chat_template, build_tokenizer, EOS, IM_END, PAD, TAG_TOKENS

TRAJ = ("<plan>Find the director.</plan>\n<web_search>director of Blue Harbor</web_search>"
        + format_observation("Blue Harbor (film) is a 1994 drama directed by Ana Vell.")
        + "<think>Ana Vell.</think>\n<code>print(2024 - 1961)</code>" + format_observation("63")
        + "<reflection>ok</reflection><suggested_answer>Ana Vell</suggested_answer><double_check>yes</double_check>"
        + "<crawl_page>Ana Vell</crawl_page>\n<answer>Ana Vell</answer>")
CORPUS = [TRAJ, "Ana Vell (born 1961) is a film director from Orsk.", "The river Melm flows through Orsk, 12 km long."] * 20
PROMPTS = ["<think>", "Who directed Blue Harbor? Think step by step.", TRAJ[:60], "x", "Ana Vell was born in"]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(CORPUS, vocab_size=400)


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_qwen2(tok, "nano", init_std=0.2)   # larger init: varied random output, so equality tests can fail


@pytest.fixture(scope="module")
def hb(model, tok):
    return HFBackend(model, tok, batch_size=2)


# ---------------------------------------------------------------- ScriptedBackend

def test_scripted_stop_earliest_and_excluded():
    sb = ScriptedBackend(lambda p: "a <code>x</code> b </answer> c")
    c = sb.generate(["p"], stop=["</answer>", "</code>"])[0]
    assert (c.text, c.finish_reason, c.stop) == ("a <code>x", "stop", "</code>")
    assert c.completion_tokens == len("a <code>x</code>".split())
    assert c.prompt_tokens == 1


def test_scripted_stop_at_start_gives_empty_text_not_none():
    c = ScriptedBackend(lambda p: "</answer>rest").generate(["p"], stop=["</answer>"])[0]
    assert (c.text, c.finish_reason, c.stop) == ("", "stop", "</answer>")


def test_scripted_budget_and_eos():
    sb = ScriptedBackend(lambda p: "one two three four </answer>")
    c = sb.generate(["p"], stop=["</answer>"], max_new_tokens=2)[0]
    assert (c.text, c.finish_reason, c.completion_tokens, c.stop) == ("one two", "length", 2, None)
    c = sb.generate(["p"], stop=None)[0]
    assert (c.finish_reason, c.text) == ("eos", "one two three four </answer>")


def test_scripted_counts_with_tokenizer(tok):
    sb = ScriptedBackend(lambda p: "<think>Ana Vell</think><answer>x</answer>", tokenizer=tok)
    c = sb.generate(["<think>"], stop=STOP_STRINGS)[0]
    assert c.stop == "</answer>" and c.text == "<think>Ana Vell</think><answer>x"
    assert c.completion_tokens == len(tok("<think>Ana Vell</think><answer>x</answer>")["input_ids"])
    assert c.prompt_tokens == 1
    c = sb.generate(["p"], stop=STOP_STRINGS, max_new_tokens=1)[0]
    assert (c.text, c.finish_reason, c.completion_tokens) == ("<think>", "length", 1)


def test_scripted_policy_must_return_text():
    with pytest.raises(TypeError, match="expected str"):
        ScriptedBackend(lambda p: None).generate(["p"])


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60), st.lists(st.sampled_from(list(STOP_STRINGS) + ["a", "ab", " "]), max_size=4),
       st.integers(0, 30))
def test_scripted_stop_property(text, stops, budget):
    c = ScriptedBackend(lambda p: text).generate(["p"], stop=stops, max_new_tokens=budget)[0]
    assert c.finish_reason in ("stop", "length", "eos")
    assert not any(s in c.text for s in stops)                 # generation ended at the FIRST stop string
    if c.finish_reason == "stop":
        assert c.stop in stops and text.startswith(c.text + c.stop)
    else:
        assert c.stop is None and text.startswith(c.text)
    assert c.completion_tokens <= budget


def test_first_stop_tie_prefers_longest():
    assert find_stop("x</code>", ["</c", "</code>"]) == (1, "</code>")


# ---------------------------------------------------------------- tokenizer

def test_tags_single_tokens_and_survive_decode(tok):
    for t in TAG_TOKENS:
        ids = tok(t)["input_ids"]
        assert len(ids) == 1
        assert tok.decode(ids) == t and tok.decode(ids, skip_special_tokens=True) == t
    ids = tok(TRAJ)["input_ids"]
    assert tok.decode(ids) == TRAJ == tok.decode(ids, skip_special_tokens=True)
    assert tok.pad_token == PAD and tok.eos_token == EOS and len(tok) <= 400


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=12), st.sampled_from(TAG_TOKENS), st.text(max_size=12))
def test_tags_never_merge_with_neighbours(tok, left, tag, right):
    text = left + tag + right
    ids = tok(text)["input_ids"]
    assert tok.convert_tokens_to_ids(tag) in ids
    assert tok.decode(ids) == text
    offsets = tok(text, return_offsets_mapping=True)["offset_mapping"]
    assert (text.index(tag), text.index(tag) + len(tag)) in [tuple(o) for o in offsets]


def test_offsets_give_observation_mask(tok):
    mask = token_loss_mask(TRAJ, tok)
    ids = tok(TRAJ)["input_ids"]
    masked = {tok.decode([i]) for i, m in zip(ids, mask) if m == 0}
    kept = {tok.decode([i]) for i, m in zip(ids, mask) if m == 1}
    assert "<observation>" in masked and "</observation>" in masked
    assert "<observation>" not in kept and "<answer>" in kept and "</code>" in kept


def test_tokenizer_round_trip_and_chat_template(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    tok2 = AutoTokenizer.from_pretrained(tmp_path)
    assert tok2(TRAJ)["input_ids"] == tok(TRAJ)["input_ids"]
    assert tok2.decode(tok2(TRAJ)["input_ids"], skip_special_tokens=True) == TRAJ
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert apply_chat_template(tok2, msgs) == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    assert apply_chat_template(tok2, "U", system="S") == apply_chat_template(tok2, msgs)
    assert tok2.convert_tokens_to_ids(IM_END) != tok2.unk_token_id


def test_tokenizer_vocab_too_small():
    with pytest.raises(ValueError, match="too small"):
        build_tokenizer(CORPUS, vocab_size=100)


# ---------------------------------------------------------------- model

def test_sizes_and_model_round_trip(tok, model, tmp_path):
    counts = {name: n_params(AutoModelForCausalLM.from_config(qwen2_config(tok, name, vocab_size=2048)))
              for name in QWEN2_SIZES}
    assert counts["nano"] < counts["tiny"] < counts["small"]
    assert 3.6e6 < counts["tiny"] < 4.2e6
    with pytest.raises(ValueError, match="unknown model size"):
        build_tiny_qwen2(tok, "huge")
    a, b = build_tiny_qwen2(tok, "nano", seed=1), build_tiny_qwen2(tok, "nano", seed=1)
    assert torch.equal(a.model.embed_tokens.weight, b.model.embed_tokens.weight)   # seeded init
    model.save_pretrained(tmp_path); tok.save_pretrained(tmp_path)
    m2 = AutoModelForCausalLM.from_pretrained(tmp_path)
    x = torch.tensor([tok(TRAJ)["input_ids"][:30]])
    with torch.no_grad():
        assert torch.allclose(model(x).logits, m2(x).logits, atol=1e-5)
    p1 = load_policy(tmp_path).generate(PROMPTS[:2], max_new_tokens=5)
    p2 = HFBackend(model, tok).generate(PROMPTS[:2], max_new_tokens=5)
    assert [c.text for c in p1] == [c.text for c in p2]


# ---------------------------------------------------------------- HFBackend

def test_batched_greedy_equals_unbatched(hb):
    batched = hb.generate(PROMPTS, max_new_tokens=10)          # batch_size=2: several left-padded batches
    single = [hb.generate([p], max_new_tokens=10)[0] for p in PROMPTS]
    assert [c.text for c in batched] == [c.text for c in single]
    assert [c.prompt_tokens for c in batched] == [len(hb.tokenizer(p)["input_ids"]) for p in PROMPTS]
    assert len({c.text for c in batched}) > 1
    assert all(c.completion_tokens == 10 and c.finish_reason == "length" for c in batched)


def test_stop_strings_per_row(hb):
    free = hb.generate(PROMPTS, max_new_tokens=10)
    stops = [free[1].text[3:6], free[3].text[2:4]]
    cut = hb.generate(PROMPTS, stop=stops, max_new_tokens=10)
    singles = [hb.generate([p], stop=stops, max_new_tokens=10)[0] for p in PROMPTS]
    for f, c, s in zip(free, cut, singles):
        assert (c.text, c.stop, c.finish_reason) == (s.text, s.stop, s.finish_reason)  # rows do not disturb each other
        hit = find_stop(f.text, stops)
        if hit:
            assert (c.finish_reason, c.stop, c.text) == ("stop", hit[1], f.text[:hit[0]])
            assert c.completion_tokens <= f.completion_tokens
        else:
            assert (c.text, c.finish_reason) == (f.text, "length")
    assert cut[1].finish_reason == "stop" and cut[3].finish_reason == "stop"


def test_eos_ends_generation(model, tok):
    x = torch.tensor([tok(PROMPTS[1])["input_ids"]])
    with torch.no_grad():
        ids = model.generate(x, max_new_tokens=8, do_sample=False, eos_token_id=None)[0, x.shape[1]:].tolist()
    hb = HFBackend(model, tok)
    hb.eos_ids = [ids[2]]                                       # pretend the model's third token is its end of text
    c = hb.generate([PROMPTS[1]], max_new_tokens=8)[0]
    first = ids.index(ids[2])
    assert (c.finish_reason, c.completion_tokens, c.text) == ("eos", first + 1, tok.decode(ids[:first]))


def test_model_generation_defaults_do_not_leak(model, tok):
    base = HFBackend(model, tok).generate(PROMPTS[:2], max_new_tokens=8)
    gc = model.generation_config
    old = (gc.repetition_penalty, gc.do_sample, gc.top_k)
    gc.repetition_penalty, gc.do_sample, gc.top_k = 5.0, True, 3          # like Qwen's shipped generation_config
    try:
        again = HFBackend(model, tok).generate(PROMPTS[:2], max_new_tokens=8)
    finally:
        gc.repetition_penalty, gc.do_sample, gc.top_k = old
    assert [c.text for c in again] == [c.text for c in base]


def test_seeded_sampling_reproducible_and_rng_untouched(hb):
    torch.manual_seed(123); expected = torch.rand(1)
    torch.manual_seed(123)
    a = hb.generate(PROMPTS, max_new_tokens=8, temperature=1.0, seed=5)
    assert torch.equal(torch.rand(1), expected)                 # the global RNG is left as it was
    b = hb.generate(PROMPTS, max_new_tokens=8, temperature=1.0, seed=5)
    c = hb.generate(PROMPTS, max_new_tokens=8, temperature=1.0, seed=6)
    g = hb.generate(PROMPTS, max_new_tokens=8, temperature=0.0)
    assert [x.text for x in a] == [x.text for x in b]
    assert [x.text for x in a] != [x.text for x in c]
    assert [x.text for x in a] != [x.text for x in g]


def test_unseeded_sampling_differs_across_calls(hb):
    "Without a seed, calling again samples anew (pass@k loops, a sampling client); the server relies on it too."
    torch.manual_seed(0)
    runs = [[x.text for x in hb.generate(PROMPTS, max_new_tokens=12, temperature=1.0)] for _ in range(3)]
    assert runs[0] != runs[1] and runs[1] != runs[2]


def test_hf_edge_cases(model, tok):
    hb = HFBackend(model, tok)
    assert hb.generate(["x"], max_new_tokens=0)[0] == Completion("", 1, 0, "length")
    assert hb.generate([], max_new_tokens=3) == []
    with pytest.raises(ValueError, match="tokenizer"):
        HFBackend(model)
    with pytest.raises(TypeError, match="chat=True"):
        hb.generate([[{"role": "user", "content": "hi"}]])
    chat = HFBackend(model, tok, chat=True, system="S")
    assert chat.render("hi") == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    c = chat.generate(["hi"], max_new_tokens=2)[0]
    assert c.prompt_tokens == len(tok(chat.render("hi"))["input_ids"])


# ---------------------------------------------------------------- OpenAIBackend against a scripted HTTP server

class _Fake(BaseHTTPRequestHandler):
    "Answers POSTs from a per-server script: a list of behaviours consumed in order, the last one repeated."
    def log_message(self, *a): pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv = self.server
        srv.requests.append((self.path, body))
        mode = srv.script[min(len(srv.requests) - 1, len(srv.script) - 1)]
        if mode == "hang":
            time.sleep(1.5); return
        if isinstance(mode, int):
            return self._raw(mode, json.dumps({"error": {"message": f"status {mode}"}}).encode())
        if mode == "badjson":
            return self._raw(200, b'{"choices": [oops')
        if mode == "nousage":
            return self._raw(200, json.dumps({"id": "x", "object": "text_completion", "choices": [
                {"index": 0, "text": "hi", "finish_reason": "stop"}]}).encode())
        choice = {"index": 0, "finish_reason": "stop", "stop_reason": "</code>" if mode == "stopped" else None}
        if "chat" in self.path: choice["message"] = {"role": "assistant", "content": "answer"}
        else: choice["text"] = "answer"
        self._raw(200, json.dumps({"id": "x", "object": "text_completion", "created": 0, "model": body.get("model"),
                                   "choices": [choice],
                                   "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}).encode())

    def _raw(self, status, data):
        self.send_response(status)
        self.send_header("Content-Type", "application/json"); self.send_header("Content-Length", str(len(data)))
        self.end_headers(); self.wfile.write(data)


@pytest.fixture
def fake():
    servers = []
    def start(*script):
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
        srv.daemon_threads = True
        srv.script, srv.requests = list(script), []
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return srv, f"http://127.0.0.1:{srv.server_address[1]}/v1"
    yield start
    for s in servers: s.shutdown(); s.server_close()


@pytest.mark.parametrize("mode", [500, 503, 429, "badjson", "nousage"])
def test_openai_retries_then_raises(fake, mode):
    srv, url = fake(mode)
    be = OpenAIBackend(url, "m", timeout=5, max_retries=2, backoff_s=0.01)
    with pytest.raises(BackendError, match="failed 3 times"):
        be.generate(["hi"])
    assert len(srv.requests) == 3


def test_openai_timeout_then_raises(fake):
    srv, url = fake("hang")
    be = OpenAIBackend(url, "m", timeout=0.3, max_retries=1, backoff_s=0.01)
    t0 = time.time()
    with pytest.raises(BackendError, match="Timeout"):
        be.generate(["hi"])
    assert len(srv.requests) == 2 and time.time() - t0 < 5


def test_openai_recovers_after_transient_errors(fake):
    srv, url = fake(500, "badjson", "stopped")
    be = OpenAIBackend(url, "m", timeout=5, max_retries=3, backoff_s=0.01)
    c = be.generate(["hi"], stop=["</code>", "</answer>"], max_new_tokens=9, temperature=0.5, seed=4)[0]
    assert c == Completion("answer", 7, 3, "stop", "</code>")
    path, body = srv.requests[-1]
    assert path == "/v1/completions"
    assert (body["prompt"], body["stop"], body["max_tokens"], body["temperature"], body["seed"]) == \
        ("hi", ["</code>", "</answer>"], 9, 0.5, 4)


def test_openai_client_error_is_not_retried(fake):
    srv, url = fake(400)
    with pytest.raises(BackendError, match="HTTP 400"):
        OpenAIBackend(url, "m", max_retries=3, backoff_s=0.01).generate(["hi"])
    assert len(srv.requests) == 1


def test_openai_chat_and_finish_reasons(fake):
    srv, url = fake("ok")
    be = OpenAIBackend(url, "m", chat=True, backoff_s=0.01)
    cs = be.generate(["q1", [{"role": "system", "content": "s"}, {"role": "user", "content": "q2"}]], stop=["</code>"])
    assert [c.text for c in cs] == ["answer", "answer"]
    assert cs[0].finish_reason == "eos"                  # the server said stop_reason=null: the model ended itself
    bodies = sorted((b["messages"] for p, b in srv.requests), key=len)
    assert bodies == [[{"role": "user", "content": "q1"}], [{"role": "system", "content": "s"}, {"role": "user", "content": "q2"}]]
    assert all(p == "/v1/chat/completions" for p, b in srv.requests)
    with pytest.raises(TypeError, match="chat=True"):
        OpenAIBackend(url, "m").generate([[{"role": "user", "content": "x"}]])


# ---------------------------------------------------------------- llm_judge

def _verdict(v, fence=True):
    j = json.dumps({"rationale": "because", "judgement": v})
    return f"Here you go:\n```json\n{j}\n```\nDone." if fence else j


def test_judge_fenced_json():
    assert llm_judge("q", "Ana Vell", "ana vell", ScriptedBackend(lambda p: _verdict("correct"))) is True
    assert llm_judge("q", "Ana Vell", "Bo", ScriptedBackend(lambda p: _verdict("incorrect", fence=False))) is False


def test_judge_sees_question_gold_prediction():
    seen = []
    judge = ScriptedBackend(lambda p: seen.append(p) or _verdict("correct"))
    llm_judge("Who directed Blue Harbor?", "Ana Vell", "A. Vell", judge)
    assert all(s in seen[0] for s in ("Who directed Blue Harbor?", "Ana Vell", "A. Vell", "judgement"))


def test_judge_malformed_then_good():
    replies = iter(["hmm", '{"judgement": "perhaps"}', _verdict("correct")])
    calls = []
    class Spy(ScriptedBackend):
        def generate(self, prompts, stop=None, max_new_tokens=256, temperature=0.0, seed=None):
            calls.append((temperature, seed)); return super().generate(prompts, stop, max_new_tokens, temperature, seed)
    assert llm_judge("q", "a", "a", Spy(lambda p: next(replies)), retries=2) is True
    assert calls[0] == (0.0, None) and calls[1][0] > 0 and calls[1][1] != calls[2][1]


def test_judge_always_malformed_raises():
    n = []
    with pytest.raises(JudgeError, match="no verdict in 3 tries"):
        llm_judge("q", "a", "a", ScriptedBackend(lambda p: n.append(1) or "I cannot decide {"), retries=2)
    assert len(n) == 3


def test_judge_no_prediction_is_incorrect_without_asking():
    def boom(p): raise AssertionError("judge called")
    assert llm_judge("q", "a", None, ScriptedBackend(boom)) is False
    assert llm_judge("q", "a", "  ", ScriptedBackend(boom)) is False


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_parse_judgement_never_raises(text):
    assert parse_judgement(text) in (True, False, None)
    assert parse_judgement(text + _verdict("incorrect")) is False     # the last verdict wins
