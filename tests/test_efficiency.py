"""The efficiency analysis (`coa_lib.efficiency`) reads each system's records back into the same numbers the evaluation
that wrote them reported: a single model's `evaluate` metrics and AgentFlow's `flow_metrics`; and compares systems only on
the tasks they share."""
import pytest

from coa_lib.agentflow import AF_KINDS, flow_metrics, solve
from coa_lib.core import atomic_write_json
from coa_lib.efficiency import EpisodeCosts, FlowCosts, TaskCost, common_tasks, efficiency_summary, summarize_costs
from coa_lib.evaluate import evaluate
from coa_lib.flow_stages import _compact
from coa_lib.llm import build_tiny_qwen2
from coa_lib.scripted_flow import FlowKnobs, scripted_modules
from coa_lib.tasks import make_task_suite
from coa_lib.tokenizer import build_tokenizer, tokenizer_texts
from coa_lib.toy import ToyToolBox, toy_tasks, toy_texts, toy_world


def test_episode_costs_match_the_evaluation(tmp_path):
    "An untrained student's records, read as costs, give back evaluate's accuracy, tokens, tool calls and turns."
    tok = build_tokenizer(toy_texts(n_worlds=20), vocab_size=600)
    model = build_tiny_qwen2(tok, size="nano", seed=0).eval()
    table = toy_world(5)
    m, _ = evaluate((model, tok), toy_tasks(table, 6, seed=2), toolbox=ToyToolBox(table), run_dir=tmp_path, name="ev",
                    max_turns=3, max_new_tokens=24, max_total_tokens=400, progress=False)
    s = summarize_costs(EpisodeCosts("ev", "test").load(tmp_path))
    assert s["n"] == m["n_tasks"] == 6
    assert s["accuracy"] == pytest.approx(m["accuracy"])
    assert s["generated_tokens"] == pytest.approx(m["mean_generated_tokens"])
    assert s["prompt_tokens_cached"] + s["generated_tokens"] == pytest.approx(m["mean_processed_tokens_cached"])
    assert s["prompt_tokens"] + s["generated_tokens"] == pytest.approx(m["mean_processed_tokens_naive"])
    assert (s["tool_calls"], s["turns"]) == (pytest.approx(m["mean_tool_calls"]), pytest.approx(m["mean_turns"]))
    assert s["wall_s"] == pytest.approx(m["wall_time_s"] / 6)


def test_flow_costs_match_flow_metrics(tmp_path):
    "The scripted AgentFlow system's compact records, read as costs, give back flow_metrics' tool calls, turns and tokens."
    tasks = [dict(t) for t in make_task_suite(AF_KINDS, 3, "dev", seed=5, worlds_per_split=2)]
    tok = build_tokenizer(tokenizer_texts(tasks), vocab_size=512)
    recs = solve(tasks, scripted_modules(tasks, knobs=FlowKnobs(), tokenizer=tok), max_turns=4)
    m = flow_metrics(recs, tasks)
    atomic_write_json(tmp_path / "agentflow" / "eval" / "scripted.json", {"records": [_compact(r) for r in recs]})
    s = summarize_costs(FlowCosts("scripted", "test").load(tmp_path))
    assert s["accuracy"] == pytest.approx(m["accuracy"])
    assert (s["tool_calls"], s["turns"]) == (pytest.approx(m["tool_calls"]), pytest.approx(m["turns"]))
    assert s["prompt_tokens"] == pytest.approx(sum(v[0] for v in m["tokens"].values()))
    assert s["generated_tokens"] == pytest.approx(sum(v[1] for v in m["tokens"].values()))
    assert s["model_calls"] >= 3 * s["turns"]          # planner, executor and verifier every turn, the generator once


def test_systems_are_compared_on_shared_tasks_only():
    "A system evaluated on more tasks is cut to the shared ones; the reference's change against itself is 0."
    def tc(i, ok, p): return TaskCost(i, "math", ok, p, p, 0.0, 1.0, 1.0, 1.0, 0.1)
    costs = {"ref": [tc("a", True, 100), tc("b", True, 300)], "other": [tc("a", False, 10), tc("b", True, 30), tc("c", True, 1e6)]}
    assert common_tasks(costs) == ["a", "b"]
    s = efficiency_summary(costs)
    assert s["other"]["n"] == 2 and s["other"]["prompt_tokens"] == 20 and s["other"]["accuracy"] == 0.5
    assert s["other"]["vs_reference"]["tokens"] == pytest.approx(-0.9)
    assert s["ref"]["vs_reference"]["tokens"] == 0.0
