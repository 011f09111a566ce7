"Distillation and filtering: every distilled trajectory validates; each filter stage can reject; the SFT sets line up."
import json, random

import pytest

from coa_lib.distill import distill, trace_to_coa, trace_to_direct, trace_to_react
from coa_lib.filtering import (FilterConfig, ROW_STAGES, action_key, check_complexity, is_recovery, progressive_filter,
                               quality_stage)
from coa_lib.format import COA, DIRECT, REACT, parse_coa, validate_coa
from coa_lib.llm import ScriptedBackend
from coa_lib.tokenizer import build_tokenizer
from coa_lib.mas import MASLimits, run_teacher, trace_calls
from coa_lib.mas import MistakeKnobs
from coa_lib.teacher import scripted_backend
from coa_lib.tasks import make_task_suite


@pytest.fixture(scope="module")
def tasks():
    return [dict(t) for t in make_task_suite(n_per_kind=4, worlds_per_split=4, seed=5)]


@pytest.fixture(scope="module")
def tok(tasks):
    return build_tokenizer([t["question"] + " " + t["answer"] for t in tasks] * 5, vocab_size=600)


@pytest.fixture(scope="module")
def traces(tasks, tok, tmp_path_factory):
    knobs = MistakeKnobs(vague_query_p=0.3, misread_p=0.3, arithmetic_slip_p=0.3, skip_check_p=0.2, critic_detect_p=0.7)
    return run_teacher(tasks, scripted_backend(tasks, knobs), tok, run_dir=tmp_path_factory.mktemp("run"), shard_size=8, progress=False)


def test_every_distilled_trajectory_validates(traces):
    for tr in traces:
        assert validate_coa(trace_to_coa(tr), fmt=COA) == [], tr["id"]
        assert validate_coa(trace_to_react(tr), fmt=REACT) == [], tr["id"]
        assert validate_coa(trace_to_direct(tr), fmt=DIRECT) == [], tr["id"]


def test_coa_keeps_every_real_observation_in_order(traces):
    for tr in traces:
        tools = [c for c in trace_calls(tr) if c["tool"]]
        segs = [s for s in parse_coa(trace_to_coa(tr)) if s.tag in ("web_search", "crawl_page", "code")]
        assert [(s.tag, s.content.strip()) for s in segs] == [(c["tool"], c["argument"]) for c in tools]


def test_react_and_direct_drop_the_other_roles(traces):
    for tr in traces:
        react = {s.tag for s in parse_coa(trace_to_react(tr)) if s.tag}
        assert not react & {"plan", "reflection", "suggested_answer", "double_check"}
        assert [s.tag for s in parse_coa(trace_to_direct(tr)) if s.tag] == ["answer"]


def test_distilled_rows_are_sft_ready(traces, tok):
    ds = distill(traces, "coa", tok)
    assert ds.num_rows == traces.num_rows
    assert all(p.startswith("<|im_start|>system") and p.endswith("<|im_start|>assistant\n") for p in ds["prompt"])
    assert ds["reward"] == traces["reward"]


def _garbage_traces(tasks, tok, tmp_path):
    rng = random.Random(0)
    bits = ["<plan>x", "<web_search></web_search>", "</think>", "<observation>", "<answer>1</answer>", "<code>print(1)</code>", "{", "<report>r"]
    policy = lambda prompt: "".join(rng.choice(bits) for _ in range(rng.randint(0, 5)))
    return run_teacher(tasks[:6], ScriptedBackend(policy), tok, run_dir=tmp_path, progress=False,
                       limits=MASLimits(max_rounds=2, max_agent_turns=2))


def test_garbage_traces_distill_and_are_filtered_out(tasks, tok, tmp_path):
    ds = _garbage_traces(tasks, tok, tmp_path)
    rows = distill(ds, "coa", tok)              # never raises
    kept, report = progressive_filter(rows)
    assert all(r["reward"] == 1.0 and validate_coa(r["completion"]) == [] for r in kept)


def test_filter_keeps_only_valid_correct_rows_and_reports_each_stage(traces, tok):
    rows = distill(traces, "coa", tok)
    kept, report = progressive_filter(rows)
    assert [s["stage"] for s in report] == ["distilled", "format", "correctness", "complexity", "quality"]
    for a, b in zip(report[1:], report[2:]): assert b["in"] == a["out"]
    assert report[2]["out"] < report[2]["in"]          # with these knobs some answers are wrong
    assert all(r["reward"] == 1.0 and validate_coa(r["completion"]) == [] for r in kept)
    ids = [r["id"] for r in kept]
    assert len(ids) - len(set(ids)) == sum(r["copy"] > 0 for r in kept)   # copies only from up-sampling
    assert all(r["recovery"] for r in kept if r["copy"] > 0)


def test_each_stage_can_reject(traces, tok):
    rows = [r for r in distill(traces, "coa", tok) if r["reward"] == 1.0]
    r = rows[0]
    fmt, corr, cplx = (fn for _, fn in ROW_STAGES)
    cfg = FilterConfig()
    assert fmt({**r, "completion": r["completion"] + "\nstray"}, cfg) is not None
    assert corr({**r, "reward": 0.5}, cfg) is not None
    assert cplx(r, FilterConfig(max_steps=2)) is not None
    assert cplx(r, FilterConfig(min_steps=999)) is not None
    kept, why = quality_stage([r, dict(r)], cfg)
    assert why["near-duplicate"] == 1
    kept, why = quality_stage([r, {**r, "completion": r["completion"].replace("<plan>", "<plan>other ")}], FilterConfig(cap_per_task=1))
    assert why["cap per task"] >= 1 and len(kept) == 1


def test_recovery_detection_matches_the_teacher_flag(traces, tok):
    rows = distill(traces, "coa", tok)
    for r in rows:
        if r["recovered"]: assert is_recovery(r["completion"]), r["id"]


def test_action_key_ignores_observations():
    a = "<think>x</think><web_search>Ana</web_search>\n<observation>\none\n</observation>\n<answer>1</answer>"
    b = a.replace("one", "two")
    assert action_key(a) == action_key(b) and action_key(a) != action_key(a.replace("Ana", "Bo"))
