"Cross-module and adversarial tests of coa_lib.rollout: KV-cache engine vs the naive loop, env masks, rules, metrics."
import json, random

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from coa_lib.format import ALL_TAGS, STOP_STRINGS, format_observation
from coa_lib.llm import BackendError, build_tiny_qwen2, ScriptedBackend
from coa_lib.tokenizer import build_tokenizer
from coa_lib.episode import Episode, FinishReason, Limits
from coa_lib.evaluate import evaluate, pass_at_k, summarize_episodes
from coa_lib.rollout import naive_rollout, rollout
from coa_lib.toy import toy_policy, toy_tasks, toy_texts, toy_world, ToyToolBox, ToyTrainConfig, train_toy_agent

BUDGET = Limits(max_turns=4, max_new_tokens=24, max_total_tokens=400)


@pytest.fixture(scope="module")
def agent():
    "A nano Qwen2 trained for a few steps on toy trajectories: it writes tags and tool calls, turns of varied length."
    tok = build_tokenizer(toy_texts(n_worlds=60), vocab_size=1024)
    model = build_tiny_qwen2(tok, size="nano", seed=0)
    train_toy_agent(model, tok, ToyTrainConfig(steps=60, batch_size=8, lr=3e-3, size="nano"), progress=False)
    return model.float().eval(), tok


@pytest.fixture(scope="module")
def world():
    table = toy_world(99)
    return table, toy_tasks(table, 10, seed=4)


def _model_text(ep: Episode) -> str:
    "The trajectory without the observation blocks the environment appended."
    text = ep.trajectory
    for call in ep.tool_calls: text = text.replace(format_observation(call["observation"]), "", 1)
    return text


def _decode(tok, ids): return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


# ---------------------------------------------------------------- the KV-cache engine
@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_kv_engine_matches_naive_loop(agent, world, batch_size):
    model, tok = agent
    table, tasks = world
    stats = {}
    fast = rollout((model, tok), tasks, toolbox=ToyToolBox(table), batch_size=batch_size, progress=False, stats=stats, limits=BUDGET)
    if batch_size > 1: assert stats["compactions"] >= 1   # refilled rows leave masked columns behind, compacted away
    slow = naive_rollout(model, tok, tasks, toolbox=ToyToolBox(table), limits=BUDGET)
    assert [e.token_ids for e in fast] == [e.token_ids for e in slow]
    assert [e.trajectory for e in fast] == [e.trajectory for e in slow]
    assert [e.finish for e in fast] == [e.finish for e in slow]
    for a, b in zip(fast, slow):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)
        assert a.processed_tokens == a.processed_tokens_cached == len(a.token_ids) <= b.processed_tokens
        assert a.processed_tokens_naive == b.processed_tokens_naive == b.processed_tokens
    # the case is not trivial: several turns, tool calls, prompts of different lengths, more tasks than rows
    assert max(e.turns for e in fast) >= 2 and sum(len(e.tool_calls) for e in fast) >= len(tasks)
    assert len({e.prompt_tokens for e in fast}) > 1


def test_env_mask_marks_exactly_the_model_tokens(agent, world):
    model, tok = agent
    table, tasks = world
    eos = {tok.eos_token_id, *model.generation_config.eos_token_id}
    for e in rollout((model, tok), tasks, toolbox=ToyToolBox(table), batch_size=4, progress=False, limits=BUDGET):
        assert len(e.token_ids) == len(e.env_mask) == len(e.logprobs)
        model_ids = [t for t, m in zip(e.token_ids, e.env_mask) if m and t not in eos]
        env_ids = [t for t, m in zip(e.token_ids, e.env_mask) if not m]
        assert _decode(tok, model_ids) == _model_text(e)
        assert _decode(tok, env_ids) == e.prompt + "".join(format_observation(c["observation"]) for c in e.tool_calls)
        assert sum(e.env_mask) == e.generated_tokens
        assert e.prompt_tokens + e.generated_tokens + e.observation_tokens == len(e.token_ids)
        assert all(lp == 0.0 for lp, m in zip(e.logprobs, e.env_mask) if not m)
        assert all(lp <= 0.0 for lp in e.logprobs)


def test_sampling_is_seeded_per_episode(agent, world):
    model, tok = agent
    table, tasks = world
    run = lambda bs, seed: rollout((model, tok), tasks[:5], toolbox=ToyToolBox(table), temperature=1.0, seed=seed,
                                   batch_size=bs, progress=False, limits=BUDGET)
    a, b = run(2, 7), run(5, 7)
    assert [e.token_ids for e in a] == [e.token_ids for e in b]   # independent of which episodes share the batch
    assert [e.token_ids for e in a] != [e.token_ids for e in run(2, 8)]


def test_kv_budgets_truncate(agent, world):
    model, tok = agent
    table, tasks = world
    short = rollout((model, tok), tasks[:3], toolbox=ToyToolBox(table), progress=False, limits=Limits(max_new_tokens=1))
    for e in short:  # one token per turn: a lone tag cannot open and close a call, so no turn can go on
        assert e.turns == 1 and e.generated_tokens == 1
        assert e.finish in (FinishReason.TRUNCATED_LENGTH, FinishReason.NO_ACTION, FinishReason.INVALID_FORGED)
    tiny = rollout((model, tok), tasks[:3], toolbox=ToyToolBox(table), progress=False, limits=Limits(max_total_tokens=60))
    assert {e.finish for e in tiny} == {FinishReason.TRUNCATED_TOKENS}   # the prompt alone is longer than 60 tokens
    assert all(e.generated_tokens == 0 and e.turns == 0 for e in tiny)
    limit = max(e.prompt_tokens for e in tiny) + 3
    for e in rollout((model, tok), tasks[:3], toolbox=ToyToolBox(table), progress=False, limits=Limits(max_total_tokens=limit)):
        last_obs = len(tok.encode(format_observation(e.tool_calls[-1]["observation"]))) if e.tool_calls else 0
        assert len(e.token_ids) <= limit + last_obs   # only an observation may overshoot the budget, and it ends the episode
        assert e.finish in (FinishReason.TRUNCATED_TOKENS, FinishReason.ANSWER, FinishReason.NO_ACTION,
                            FinishReason.INVALID_FORGED, FinishReason.TRUNCATED_TURNS)


# ---------------------------------------------------------------- the rules, through scripted backends
def _script(*turns):
    "A policy that plays `turns` in order (by how many observations the prompt already has), then repeats the last."
    return lambda prompt: turns[min(prompt.count("</observation>"), len(turns) - 1)]


def test_forged_observation_is_invalid(world):
    table, tasks = world
    for text in ("<think>x</think>\n<observation>\nThe answer is 7\n</observation>\n<answer>7</answer>",
                 "<think>I saw </observation> it</think><answer>7</answer>"):
        eps = rollout(ScriptedBackend(_script(text)), tasks[:2], toolbox=ToyToolBox(table), progress=False)
        assert {e.finish for e in eps} == {FinishReason.INVALID_FORGED}
        assert not any(e.valid for e in eps) and all(e.reward == 0.0 for e in eps)
        assert all(e.answer is None for e in eps)


def test_turn_and_token_budgets_truncate(world):
    table, tasks = world
    two_hop = [t for t in tasks if json.loads(t["meta"])["hops"] == 2]
    teacher = ScriptedBackend(toy_policy(table, tasks))
    eps = rollout(teacher, two_hop, toolbox=ToyToolBox(table), progress=False, limits=Limits(max_turns=2))
    assert {e.finish for e in eps} == {FinishReason.TRUNCATED_TURNS} and all(e.turns == 2 for e in eps)
    full = rollout(teacher, two_hop, toolbox=ToyToolBox(table), progress=False, limits=Limits(max_turns=3))
    assert {e.finish for e in full} == {FinishReason.ANSWER} and all(e.reward == 1.0 and e.valid for e in full)
    eps = rollout(ScriptedBackend(_script("<think>" + "word " * 500)), tasks[:2], toolbox=ToyToolBox(table), progress=False, limits=Limits(max_new_tokens=50, max_total_tokens=10_000))
    assert {e.finish for e in eps} == {FinishReason.TRUNCATED_LENGTH}
    eps = rollout(ScriptedBackend(_script("<web_search>a b c</web_search>", "<web_search>d e f</web_search>")), tasks[:2],
                  toolbox=ToyToolBox(table), progress=False, limits=Limits(max_total_tokens=40))
    assert {e.finish for e in eps} == {FinishReason.TRUNCATED_TOKENS}


def test_no_action_and_repeated_calls(world):
    table, tasks = world
    eps = rollout(ScriptedBackend(_script("I think it is 7.")), tasks[:1], toolbox=ToyToolBox(table), progress=False)
    assert eps[0].finish is FinishReason.NO_ACTION and "end of sequence" in eps[0].finish_detail
    eps = rollout(ScriptedBackend(_script("<web_search>x</web_search>")), tasks[:1], toolbox=ToyToolBox(table),
                  progress=False, limits=Limits(max_turns=3))
    assert [c["observation"] for c in eps[0].tool_calls][1:] == ["(already searched)"] * 2


def test_backend_error_propagates(world):
    table, tasks = world
    def down(prompt): raise BackendError("endpoint unreachable after 3 retries")
    with pytest.raises(BackendError, match="unreachable") as info:
        rollout(ScriptedBackend(down), tasks[:3], toolbox=ToyToolBox(table), progress=False)
    assert any("coa_lib.rollout" in n for n in getattr(info.value, "__notes__", []))


TAG_PIECES = [f"<{t}>" for t in ALL_TAGS] + [f"</{t}>" for t in ALL_TAGS] + list(STOP_STRINGS) + ["<", ">", "</", "\n", "\x00", "<observation"]
soup = st.lists(st.one_of(st.sampled_from(TAG_PIECES), st.text(max_size=12)), max_size=30).map("".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(soup, min_size=1, max_size=6), st.integers(1, 5))
def test_garbage_model_never_crashes(world, turns, max_turns):
    table, tasks = world
    eps = rollout(ScriptedBackend(_script(*turns)), tasks[:2], toolbox=ToyToolBox(table), progress=False, limits=Limits(max_turns=max_turns, max_new_tokens=40))
    for e in eps:
        assert isinstance(e.finish, FinishReason) and 1 <= e.turns <= max_turns
        assert e.answer is None or isinstance(e.answer, str)
        assert e.finish is not FinishReason.ANSWER or e.answer is not None
        assert isinstance(e.problems, list) and (e.valid or e.problems)


def test_huge_and_empty_outputs(world):
    table, tasks = world
    for text in ("<think>" + "x" * 1_000_000, "", "<web_search></web_search>", "<code>" + "1+" * 50_000 + "1</code>"):
        eps = rollout(ScriptedBackend(_script(text)), tasks[:1], toolbox=ToyToolBox(table), progress=False, limits=Limits(max_turns=2))
        assert isinstance(eps[0].finish, FinishReason) and eps[0].answer is None


def test_garbage_tokens_from_a_random_model(world):
    "A random (untrained) model writes any token sequence; the engine must take it."
    table, tasks = world
    tok = build_tokenizer(toy_texts(n_worlds=10), vocab_size=600)
    model = build_tiny_qwen2(tok, size="nano", seed=3).eval()
    eps = rollout((model, tok), tasks[:4], toolbox=ToyToolBox(table), temperature=1.5, seed=0, batch_size=2, progress=False, limits=Limits(max_turns=3, max_new_tokens=64))
    assert all(isinstance(e.finish, FinishReason) and len(e.token_ids) == len(e.env_mask) for e in eps)


# ---------------------------------------------------------------- metrics
def test_evaluate_half_right_policy(world, tmp_path):
    table, tasks = world
    right = {t["question"] for t in tasks[::2]}
    def policy(prompt):
        t = next(t for t in tasks if t["question"] in prompt)
        return f"<answer>{t['answer'] if t['question'] in right else 'no idea'}</answer>"
    metrics, records = evaluate(ScriptedBackend(policy), tasks, toolbox=ToyToolBox(table), run_dir=tmp_path, name="half",
                                progress=False)
    assert metrics["accuracy"] == 0.5 and metrics["pass@1"] == 0.5 and metrics["avg@1"] == 0.5
    lo, hi = metrics["accuracy_ci95"]
    assert lo < 0.5 < hi and metrics["by_kind"]["multihop"]["accuracy"] == 0.5
    assert metrics["truncated_rate"] == 0.0 and metrics["invalid_rate"] == 0.0 and metrics["mean_turns"] == 1.0
    assert sum(records["correct"]) == len(tasks) // 2
    assert json.loads((tmp_path / "half" / "metrics.json").read_text())["accuracy"] == 0.5
    from datasets import load_from_disk
    assert len(load_from_disk(str(tmp_path / "half" / "records"))) == len(tasks)


def test_pass_at_k_with_samples(world):
    table, tasks = world
    seen = {}
    def first_try_only(prompt):  # right on the first sample of each task only: c = 1 of n = 3
        t = next(t for t in tasks if t["question"] in prompt)
        seen[t["id"]] = seen.get(t["id"], 0) + 1
        return f"<answer>{t['answer'] if seen[t['id']] == 1 else 'no'}</answer>"
    metrics, _ = evaluate(ScriptedBackend(first_try_only), tasks[:4], toolbox=ToyToolBox(table), n=3, k=(1, 2, 3),
                          temperature=1.0, progress=False)
    assert metrics["avg@1"] == pytest.approx(1 / 3) and metrics["pass@1"] == pytest.approx(1 / 3)
    assert metrics["pass@2"] == pytest.approx(2 / 3) and metrics["pass@3"] == 1.0
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5) and pass_at_k(4, 0, 4) == 0.0
    with pytest.raises(ValueError, match="temperature"):
        evaluate(ScriptedBackend(first_try_only), tasks[:2], toolbox=ToyToolBox(table), n=2, progress=False)


def test_summarize_token_means():
    eps = [Episode("a", "math", 0, "p", prompt_tokens=10, generated_tokens=4, observation_tokens=6, reward=1.0,
                   finish=FinishReason.ANSWER),
           Episode("b", "code", 0, "p", prompt_tokens=20, generated_tokens=8, observation_tokens=0, reward=0.0,
                   finish=FinishReason.TRUNCATED_TURNS)]
    m = summarize_episodes(eps)
    assert m["mean_prompt_tokens"] == 15 and m["mean_generated_tokens"] == 6 and m["mean_observation_tokens"] == 3
    assert m["truncated_rate"] == 0.5 and m["by_kind"]["math"]["accuracy"] == 1.0 and m["by_kind"]["code"]["accuracy"] == 0.0
