"""Every system emits the same per-task record, `coa_lib.core.Outcome` (a model's `evaluate` records, the teacher MAS's
traces, AgentFlow's evaluations), and one `summarize` reads them back into the numbers the evaluation that wrote them
reported, with one CI key; the efficiency analysis compares systems only on the tasks they share."""
from dataclasses import fields

import pytest

from coa_lib.agentflow import AF_KINDS, flow_metrics, solve
from coa_lib.core import Outcome, atomic_write_json
from coa_lib.efficiency import common_tasks, efficiency_summary, read_outcomes
from coa_lib.episode import Limits
from coa_lib.evaluate import evaluate, summarize, teacher_metrics
from coa_lib.stage_agentflow import _compact
from coa_lib.llm import build_tiny_qwen2
from coa_lib.mas import run_teacher
from coa_lib.scripted_flow import FlowKnobs, scripted_modules
from coa_lib.tasks import make_task_suite
from coa_lib.teacher import scripted_backend
from coa_lib.tokenizer import build_tokenizer, tokenizer_texts
from coa_lib.toy import ToyToolBox, toy_tasks, toy_texts, toy_world

OUTCOME = {f.name for f in fields(Outcome)}


def _ci_keys(d) -> set[str]:
    "Every key, at any depth, that names a confidence interval."
    if isinstance(d, dict): return {k for k in d if "ci95" in k} | set().union(*map(_ci_keys, d.values()))
    return set().union(*map(_ci_keys, d)) if isinstance(d, list) else set()


def test_episode_outcomes_match_the_evaluation(tmp_path):
    "An untrained student's records, read back as outcomes, give evaluate's accuracy, tokens, tool calls and turns."
    tok = build_tokenizer(toy_texts(n_worlds=20), vocab_size=600)
    model = build_tiny_qwen2(tok, size="nano", seed=0).eval()
    table = toy_world(5)
    m, recs = evaluate((model, tok), toy_tasks(table, 6, seed=2), toolbox=ToyToolBox(table), run_dir=tmp_path, name="ev", progress=False, limits=Limits(max_turns=3, max_new_tokens=24, max_total_tokens=400))
    assert set(recs[0]["outcome"]) == OUTCOME
    s = summarize(read_outcomes(tmp_path / "ev" / "records"))
    assert s["n"] == m["n_tasks"] == 6
    assert (s["accuracy"], s["accuracy_ci95"]) == (pytest.approx(m["accuracy"]), pytest.approx(m["accuracy_ci95"]))
    assert s["generated_tokens"] == pytest.approx(m["mean_generated_tokens"])
    assert s["prompt_tokens_cached"] + s["generated_tokens"] == pytest.approx(m["mean_processed_tokens_cached"])
    assert s["prompt_tokens"] + s["generated_tokens"] == pytest.approx(m["mean_processed_tokens_naive"])
    assert (s["tool_calls"], s["turns"]) == (pytest.approx(m["mean_tool_calls"]), pytest.approx(m["mean_turns"]))
    assert s["wall_s"] == pytest.approx(m["wall_time_s"] / 6)
    assert _ci_keys(m) == _ci_keys(s) == {"accuracy_ci95"}


def test_flow_outcomes_match_flow_metrics(tmp_path):
    "The scripted AgentFlow system's compact records, read back as outcomes, give flow_metrics' accuracy, tool calls, turns and tokens."
    tasks = [dict(t) for t in make_task_suite(AF_KINDS, 3, "dev", seed=5, worlds_per_split=2)]
    tok = build_tokenizer(tokenizer_texts(tasks), vocab_size=512)
    recs = solve(tasks, scripted_modules(tasks, knobs=FlowKnobs(), tokenizer=tok), max_turns=4)
    m = flow_metrics(recs, tasks)
    atomic_write_json(tmp_path / "scripted.json", {"records": [_compact(r) for r in recs]})
    s = summarize(read_outcomes(tmp_path / "scripted.json"))
    assert (s["accuracy"], s["accuracy_ci95"]) == (pytest.approx(m["accuracy"]), pytest.approx(m["accuracy_ci95"]))
    assert (s["tool_calls"], s["turns"]) == (pytest.approx(m["tool_calls"]), pytest.approx(m["turns"]))
    assert s["prompt_tokens"] == pytest.approx(sum(v[0] for v in m["tokens"].values()))
    assert s["generated_tokens"] == pytest.approx(sum(v[1] for v in m["tokens"].values()))
    assert s["model_calls"] >= 3 * s["turns"]          # planner, executor and verifier every turn, the generator once
    assert _ci_keys(m) == {"accuracy_ci95"}            # overall, by kind, by category, by difficulty: one CI key


def test_teacher_outcomes_match_teacher_metrics(tmp_path):
    "The teacher MAS's traces carry each task's outcome; teacher_metrics and summarize agree on them."
    tasks = [dict(t) for t in make_task_suite(("multihop", "math"), 3, "dev", seed=5, worlds_per_split=2)]
    traces = run_teacher(tasks, scripted_backend(tasks), run_dir=tmp_path, name="tt", progress=False)
    assert set(traces[0]["outcome"]) == OUTCOME
    traces.save_to_disk(str(tmp_path / "teacher_eval"))
    outs = read_outcomes(tmp_path / "teacher_eval")
    tm, s = teacher_metrics(traces, [t["id"] for t in tasks]), summarize(outs)
    assert (tm["accuracy"], tm["accuracy_ci95"], tm["by_kind"]) == (s["accuracy"], s["accuracy_ci95"], s["by_kind"])
    assert tm["mean_processed_tokens"] == pytest.approx(sum(r["prompt_tokens"] + r["completion_tokens"] for r in traces) / len(tasks))
    assert [o.model_calls for o in outs] == traces["n_calls"]


def test_an_old_record_without_outcome_is_refused(tmp_path):
    "Records of an older version (no outcome) are an error naming the file, not an empty or made-up summary."
    atomic_write_json(tmp_path / "old.json", {"records": [{"id": "a", "kind": "math", "reward": 1.0}]})
    with pytest.raises(ValueError, match="old.json: record 0 has no outcome"): read_outcomes(tmp_path / "old.json")


def test_systems_are_compared_on_shared_tasks_only():
    "A system evaluated on more tasks is cut to the shared ones; the reference's change against itself is 0."
    def tc(i, ok, p): return Outcome(i, "math", ok, float(ok), p, p, 0.0, 1.0, 1.0, 1.0, 0.1)
    costs = {"ref": [tc("a", True, 100), tc("b", True, 300)], "other": [tc("a", False, 10), tc("b", True, 30), tc("c", True, 1e6)]}
    assert common_tasks(costs) == ["a", "b"]
    s = efficiency_summary(costs)
    assert s["other"]["n"] == 2 and s["other"]["prompt_tokens"] == 20 and s["other"]["accuracy"] == 0.5
    assert s["other"]["vs_reference"]["tokens"] == pytest.approx(-0.9)
    assert s["ref"]["vs_reference"]["tokens"] == 0.0
    assert _ci_keys(s) == {"accuracy_ci95"}
