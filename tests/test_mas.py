"Teacher MAS: token accounting, resume without duplicates, no unseen answers, robustness to garbage backends."
import json, random, re

import pytest
from hypothesis import given, settings, strategies as st

from coa_lib.llm import ScriptedBackend
from coa_lib.tokenizer import build_tokenizer, TokenCounter
from coa_lib.mas import (DeadTools, MAS, MASLimits, parse_plan, parse_report, parse_review, parse_verdict, run_teacher, trace_calls)
from coa_lib.mas import MistakeKnobs
from coa_lib.teacher import read_prompt, ScriptedTeacher, scripted_backend
from coa_lib.core import TASK_KINDS
from coa_lib.tasks import make_task_suite


@pytest.fixture(scope="module")
def tasks():
    return [dict(t) for t in make_task_suite(n_per_kind=3, worlds_per_split=3, seed=11)]


@pytest.fixture(scope="module")
def tok(tasks):
    texts = [t["question"] + " " + t["answer"] for t in tasks] * 5
    return build_tokenizer(texts, vocab_size=600)


@pytest.fixture(scope="module")
def traces(tasks, tok, tmp_path_factory):
    knobs = MistakeKnobs(vague_query_p=0.3, misread_p=0.3, arithmetic_slip_p=0.3, skip_check_p=0.1, critic_detect_p=0.8)
    return run_teacher(tasks, scripted_backend(tasks, knobs), tok, run_dir=tmp_path_factory.mktemp("run"), shard_size=6, progress=False)


def n_tokens(tok, text):
    return len(tok(text, add_special_tokens=False)["input_ids"])


def test_tokens_of_every_call_equal_the_tokenizer_count(traces, tok):
    checked = 0
    for tr in traces:
        calls = trace_calls(tr)
        for c in calls:
            assert c["prompt_tokens"] == n_tokens(tok, c["prompt"])
            assert c["completion_tokens"] == n_tokens(tok, c["completion"])
            checked += 1
        assert tr["prompt_tokens"] == sum(c["prompt_tokens"] for c in calls)
        assert tr["completion_tokens"] == sum(c["completion_tokens"] for c in calls)
    assert checked > 100


TAGS = ["<think>", "</think>", "<observation>", "</observation>", "<|im_start|>", "<|im_end|>", "<answer>", "<code>", "\n", " ", "  "]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(TAGS), st.text(max_size=12)), max_size=12))
def test_token_counter_is_exact(tok, parts):
    text = "".join(parts)
    count = TokenCounter(tok)
    assert count(text) == n_tokens(tok, text)
    assert count(text) == n_tokens(tok, text)   # again, from the cache


def test_resume_after_interruption_duplicates_no_trace(tasks, tok, tmp_path):
    small = tasks[:10]
    class Interrupt(Exception): pass
    def boom(i):
        if i == 1: raise Interrupt()
    with pytest.raises(Interrupt):
        run_teacher(small, scripted_backend(small), tok, run_dir=tmp_path, name="t", shard_size=3, progress=False, on_shard=boom)
    assert len(list((tmp_path / "t.shards").glob("shard-*.jsonl"))) == 2
    redone = []
    ds = run_teacher(small, scripted_backend(small), tok, run_dir=tmp_path, name="t", shard_size=3, progress=False, on_shard=redone.append)
    assert redone == [2, 3]                      # finished shards are not redone
    assert sorted(ds["id"]) == sorted(t["id"] for t in small)
    assert len(set(ds["id"])) == len(small)
    again = run_teacher(small, scripted_backend(small), tok, run_dir=tmp_path, name="t", shard_size=3, progress=False, on_shard=redone.append)
    assert redone == [2, 3] and again["id"] == ds["id"]


def test_teacher_cannot_answer_without_working_tools(tasks, tok):
    mas = MAS(ScriptedBackend(ScriptedTeacher(tasks, MistakeKnobs.perfect())), TokenCounter(tok), toolbox_fn=lambda t: DeadTools())
    for t in tasks:
        tr = mas.solve(t)
        assert tr["reward"] == 0.0, (t["kind"], tr["final_answer"])
        assert tr["final_answer"] != t["answer"]


def test_perfect_teacher_solves_every_kind(tasks, tok):
    mas = MAS(ScriptedBackend(ScriptedTeacher(tasks, MistakeKnobs.perfect())), TokenCounter(tok))
    for t in tasks:
        tr = mas.solve(t)
        assert tr["reward"] == 1.0, (t["kind"], t["question"], tr["final_answer"])
        assert tr["replans"] == 0 and tr["n_tool_calls"] >= 1


def test_answers_come_from_observations(traces):
    "A right answer of the scripted teacher was seen in (QA) or printed by (math, mixed, game24) a tool observation."
    for tr in traces:
        if tr["reward"] != 1.0 or tr["kind"] == "code": continue
        obs = "\n".join(c["observation"] or "" for c in trace_calls(tr))
        if tr["kind"] == "comparison":
            meta = json.loads(tr["meta"])
            assert all(s["fact"] in obs for s in meta["path"])     # both values were read
        else:
            assert tr["final_answer"] in obs


def test_mistakes_show_recovery_and_failure(traces):
    assert any(traces["recovered"])
    calls = [c for tr in traces for c in trace_calls(tr)]
    assert any(c["role"] == "critic" and "poor" in c["completion"] for c in calls)
    assert any(c["role"] == "planner" and c["mode"] == "replan" for c in calls)


def test_misread_is_caught_by_the_critic(tasks, tok):
    clumsy = MistakeKnobs(0.0, 1.0, 0.0, 0.0, 1.0, 0.0)
    mas = MAS(ScriptedBackend(ScriptedTeacher(tasks, clumsy)), TokenCounter(tok))
    for t in [t for t in tasks if t["kind"] == "multihop"]:
        tr = mas.solve(t)
        assert tr["recovered"] and tr["reward"] == 1.0


GARBAGE = ["", "<plan>", "</plan></plan>", "<web_search></web_search>", "<code>import os; os._exit(3)</code>", "<observation>forged</observation>",
           '{"score": "x"}', '{"information_conflict": "poor"}', "<report>", "1. [search_agent] ", "<answer>", "\x00\ufffd",
           "<crawl_page>" + "a" * 500 + "</crawl_page>", "<suggested_answer>24</suggested_answer>", "{", "<think>" * 20]


def garbage_policy(seed):
    rng = random.Random(seed)
    return lambda prompt: "".join(rng.choice(GARBAGE) + rng.choice(["", " ", "\n", "zz"]) for _ in range(rng.randint(0, 6)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mas_survives_a_garbage_backend(tasks, tok, tmp_path, seed):
    sample = [t for t in tasks if t["kind"] in ("multihop", "math", "code")][:4]
    ds = run_teacher(sample, ScriptedBackend(garbage_policy(seed)), tok, run_dir=tmp_path, shard_size=2, progress=False,
                     limits=MASLimits(max_rounds=2, max_agent_turns=2))
    assert ds.num_rows == len(sample)
    for tr in ds:
        assert 0.0 <= tr["reward"] <= 1.0 and tr["n_calls"] >= 3


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_parsers_never_raise(text):
    parse_plan(text); parse_report(text); parse_review(text); parse_verdict(text)
    p = read_prompt(text)
    assert isinstance(p.fields, dict)
