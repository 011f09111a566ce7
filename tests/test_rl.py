"Tests of coa_lib.rl: observations out of the RL loss, dynamic sampling refills, ids never re-tokenised, forged episodes score 0, resume."
import random
import shutil

import pytest
import torch

from coa_lib.core import built_record, done_marker, read_json
from coa_lib.episode import Episode, FinishReason
from coa_lib.rl import (RLConfig, build_rl_trainer, episode_reward, fill_groups, pass_rates, select_tasks, train_rl,
                        overlong_penalty, trl_sample)
from coa_lib.toy import ToyToolBox, ToyTrainConfig, build_toy_agent, toy_tasks, toy_world

CFG = dict(group_size=4, groups_per_batch=2, minibatches=2, rollout_batches=1, max_turns=3, max_new_tokens=24,
           max_total_tokens=400, dev_every=1, n_dev=1, save_every=1, max_refill_rounds=1)


@pytest.fixture(scope="module")
def agent():
    "A nano Qwen2 trained for a few seconds on toy trajectories: it searches, reads observations and answers (sometimes)."
    model, tok, _ = build_toy_agent(ToyTrainConfig(steps=60, batch_size=8, lr=3e-3, size="nano"), progress=False)
    return model.float(), tok


@pytest.fixture(scope="module")
def world():
    table = toy_world(99)
    return table, toy_tasks(table, 8, seed=4)


@pytest.fixture()
def batch(agent, world, tmp_path):
    "One rollout batch as TRL builds it (2 tasks x 4 episodes), with the trainer and the rollout function."
    model, tok = agent
    table, tasks = world
    cfg = RLConfig(**{**CFG, "dynamic_sampling": False})
    trainer, ro, _ = build_rl_trainer(model.train(), tok, tasks, tasks[:1], tmp_path, cfg, toolbox=ToyToolBox(table))
    prompts = [p for p in ro.prompts()[:2] for _ in range(cfg.group_size)]
    b = trainer._generate_and_score_completions([{"prompt": p} for p in prompts])
    assert ((b["tool_mask"] == 0) & (b["completion_mask"] == 1)).any(), "the batch should contain observation tokens"
    b["advantages"] = torch.tensor([1.0, -1.0] * (len(prompts) // 2))       # every episode gets a gradient
    b["old_per_token_logps"] = torch.zeros_like(b["completion_ids"], dtype=torch.float) - 2.0   # ratios far from 1: clipping acts
    return trainer, ro, b


def _loss_and_grads(trainer, b):
    "The RL loss of batch `b`, the gradient of every parameter, and of the final hidden state that predicts each completion token."
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps   # set by the training loop otherwise
    kept = {}
    def keep(module, inputs, out):        # TRL asks the model for log-probs through a fused lm_head: no logits tensor to hook
        out.retain_grad(); kept["h"] = out
    hook = trainer.model.model.norm.register_forward_hook(keep)
    try:
        trainer.model.zero_grad()
        loss = trainer._compute_loss(trainer.model, b)     # TRL's loss of the whole padded minibatch (training sums pieces of it: see below)
        loss.backward()
    finally:
        hook.remove()
    grads = [p.grad.detach().clone() for p in trainer.model.parameters() if p.grad is not None]
    width, n = b["prompt_ids"].shape[1], b["completion_ids"].shape[1]
    return loss.detach(), grads, kept["h"].grad[:, width - 1:width - 1 + n]      # row j: the state that predicts token j


def test_update_in_pieces_has_the_minibatch_loss_and_gradients(batch):
    "Training's `compute_loss` (pieces of `update_rows` episodes of similar length, unpadded) equals TRL's loss of the padded minibatch."
    trainer, ro, b = batch
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    out = {}
    for name, fn in (("whole", trainer._compute_loss), ("pieces", trainer.compute_loss)):
        trainer.model.zero_grad()
        loss = fn(trainer.model, b); loss.backward()
        out[name] = (loss.item(), [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None])
    assert ro.cfg.update_rows == 4 and b["completion_ids"].shape[0] == 8               # two pieces
    assert abs(out["whole"][0] - out["pieces"][0]) < 1e-5
    assert all(torch.allclose(x, y, atol=1e-6, rtol=1e-4) for x, y in zip(out["whole"][1], out["pieces"][1]))


def test_completion_ids_and_env_mask_have_equal_lengths_and_are_the_generated_ids(batch):
    trainer, ro, b = batch
    assert len(ro.last) == 8
    for i, ep in enumerate(ro.last):
        s = trl_sample(ep)
        assert len(s["completion_ids"]) == len(s["env_mask"]) == len(s["logprobs"]) > 0
        assert s["prompt_ids"] + s["completion_ids"] == ep.token_ids                      # exactly what the model saw
        n = len(s["completion_ids"])
        assert b["completion_ids"][i, :n].tolist() == s["completion_ids"]                # what TRL trains on
        assert b["tool_mask"][i, :n].tolist() == s["env_mask"]
        assert b["completion_mask"][i, n:].sum() == 0                                     # the rest is padding


def test_observation_tokens_get_no_gradient(batch):
    trainer, _, b = batch
    loss, _, g = _loss_and_grads(trainer, b)
    obs = (b["tool_mask"] == 0) & (b["completion_mask"] == 1)
    own = (b["tool_mask"] == 1) & (b["completion_mask"] == 1)
    assert torch.isfinite(loss) and obs.any() and own.any()
    assert g[obs].abs().max().item() == 0.0            # no logit that predicts an observation token is pushed
    assert g[own].abs().max().item() > 0.0


def test_changing_observation_tokens_leaves_loss_and_gradients_unchanged(batch):
    "An observation at the end of a completion (nothing after it attends to it): any change of its tokens changes nothing."
    trainer, _, b = batch
    tok_ids = b["completion_ids"]
    obs_tail = torch.randint(5, 200, (tok_ids.shape[0], 12))
    ext = lambda ids: dict(b, completion_ids=torch.cat([tok_ids, ids], 1),
                           completion_mask=torch.cat([b["completion_mask"], torch.ones_like(ids)], 1),
                           tool_mask=torch.cat([b["tool_mask"], torch.zeros_like(ids)], 1),
                           old_per_token_logps=torch.cat([b["old_per_token_logps"], torch.zeros(ids.shape)], 1))
    base = _loss_and_grads(trainer, ext(obs_tail))
    other = _loss_and_grads(trainer, ext(torch.randint(200, 400, obs_tail.shape)))
    assert torch.equal(base[0], other[0])
    assert all(torch.equal(x, y) for x, y in zip(base[1], other[1]))
    trained = dict(ext(obs_tail), tool_mask=torch.cat([b["tool_mask"], torch.ones_like(obs_tail)], 1))   # the test can fail:
    assert not torch.equal(_loss_and_grads(trainer, trained)[0], base[0])                             # unmasked, they count


def _group(task_id: str, rewards):
    return [Episode(task_id, "math", j, "p", reward=float(r), finish=FinishReason.ANSWER) for j, r in enumerate(rewards)]


def test_dropped_groups_are_refilled_to_the_batch_size():
    rng = random.Random(0)
    outcomes = {f"t{i}": [rng.random() < 0.3 for _ in range(4)] for i in range(40)}
    pool = [{"id": i} for i in outcomes]
    batch = pool[:8]
    sample = lambda ts: [_group(t["id"], outcomes[t["id"]]) for t in ts]
    draw = lambda n, taken: [t for t in pool if t["id"] not in taken and t not in batch][:n]
    groups, stats = fill_groups(batch, sample, draw, max_rounds=20)
    informative = [len(set(outcomes[t["id"]])) > 1 for t in batch]
    assert not all(informative)                                             # some groups of the batch were uninformative ...
    assert len(groups) == len(batch) and stats["groups_drawn"] - stats["groups_dropped"] == len(batch) and stats["groups_dropped"] > 0
    assert all(len({e.reward for e in g}) > 1 for _, g in groups)           # ... and were replaced by informative ones
    assert stats["degenerate_kept"] == 0


def test_rollout_func_returns_one_completion_per_prompt_with_refills(agent, world, tmp_path):
    model, tok = agent
    table, tasks = world
    solvable = lambda task, answer: float(hash((task["id"], answer, random.random())) % 2)      # mixed outcomes: informative
    cfg = RLConfig(**CFG)
    trainer, ro, _ = build_rl_trainer(model, tok, tasks, tasks[:1], tmp_path, cfg, reward_fn=solvable, toolbox=ToyToolBox(table))
    prompts = [p for p in ro.prompts()[:2] for _ in range(cfg.group_size)]
    out = ro(prompts, trainer)
    assert all(len(v) == len(prompts) for v in out.values())
    ro.reward_fn = lambda task, answer: 0.0                                 # every group all-fail: dropped, refilled once, then kept
    out = ro(prompts, trainer)
    assert all(len(v) == len(prompts) for v in out.values())
    h = ro.history[-1]
    assert h["groups_dropped"] == h["groups_drawn"] == 4 and h["degenerate_kept"] == 2 and h["rounds"] == 2


def test_forged_observation_scores_zero(agent, world, tmp_path):
    "A policy that writes <observation> itself gets 0, even where the reward function would have paid."
    model, tok = agent
    table, tasks = world
    forge_id = tok.convert_tokens_to_ids("<observation>")
    assert forge_id != tok.unk_token_id
    cfg = RLConfig(**{**CFG, "dynamic_sampling": False})
    trainer, ro, _ = build_rl_trainer(model, tok, tasks, tasks[:1], tmp_path, cfg, reward_fn=lambda t, a: 1.0,
                                      toolbox=ToyToolBox(table))
    def forge(module, inputs, logits):
        logits[..., forge_id] += 100.0
        return logits
    hook = model.lm_head.register_forward_hook(forge)
    try:
        out = ro([ro.prompts()[0]] * cfg.group_size, trainer)
    finally:
        hook.remove()
    assert {e.finish for e in ro.last} == {FinishReason.INVALID_FORGED}
    shaped = [overlong_penalty(len(e.token_ids), cfg.max_total_tokens, cfg.overlong_buffer, cfg.overlong_penalty) for e in ro.last]
    assert out["reward"] == shaped and all(r <= 0 for r in shaped)      # no task reward; only DAPO's length penalty, if any
    forged = Episode("x", "math", 0, "p", answer="4", reward=1.0, finish=FinishReason.INVALID_FORGED)
    assert episode_reward(forged) == 0.0


def test_truncated_episodes_are_masked_out_only_with_overlong_filtering():
    ep = Episode("x", "math", 0, "p", token_ids=[1, 2, 3, 4, 5], env_mask=[0, 0, 1, 0, 1], logprobs=[0, 0, -1.0, 0, -2.0],
                 finish=FinishReason.TRUNCATED_TURNS)
    s = trl_sample(ep, mask_truncated=True)
    assert s["completion_ids"] == [3, 4, 5] and s["env_mask"] == [0, 0, 0]
    assert trl_sample(ep)["env_mask"] == [1, 0, 1]                       # DAPO's published recipe: no filtering ...
    assert trl_sample(ep, max_length=6, buffer=4)["reward"] == -0.75     # ... the soft overlong punishment instead (5 of 6 tokens)


def test_selection_keeps_sometimes_solved_tasks(agent, world):
    model, tok = agent
    table, tasks = world
    cfg = RLConfig(**CFG)
    rates = pass_rates((model, tok), tasks[:3], 4, cfg, toolbox=ToyToolBox(table), reward_fn=lambda t, a: float(t["id"] != tasks[0]["id"]))
    assert [r["passes"] for r in rates][0] == 0
    assert [t["id"] for t in select_tasks(tasks[:3], rates, 0.875)] == [r["id"] for r in rates if 1 <= r["passes"] <= 3]


def test_train_rl_resumes_from_its_checkpoint(agent, world, tmp_path):
    model, tok = agent
    table, tasks = world
    cfg = RLConfig(**{**CFG, "rollout_batches": 2, "lr": 1e-3})
    ro_cfg = dict(toolbox=ToyToolBox(table))
    whole = train_rl(_copy(model), tasks, tasks[:2], tmp_path / "whole", cfg, tokenizer=tok, **ro_cfg)
    part = train_rl(_copy(model), tasks, tasks[:2], tmp_path / "part", cfg, tokenizer=tok, **ro_cfg)
    assert built_record(part)["global_step"] == 4
    done_marker(part).unlink(); shutil.rmtree(part / "checkpoints" / "checkpoint-4")   # as if killed after the first rollout batch
    resumed = train_rl(_copy(model), tasks, tasks[:2], tmp_path / "part", cfg, tokenizer=tok, **ro_cfg)
    done = built_record(resumed)
    assert done["global_step"] == 4 and done["resumed_from"] == "checkpoint-2"
    curves = read_json(resumed / "rl_curves.json")
    assert len(curves["sampled_reward"]) == 2 and [s for s, _ in curves["dev_accuracy"]] == [0, 2, 4]   # histories continued
    assert curves == read_json(whole / "rl_curves.json")                     # the same run as without the interruption


def _copy(model):
    import copy
    return copy.deepcopy(model)


def test_refreshed_pool_resumes_and_trains_on_the_frontier(agent, world, tmp_path):
    "With refresh_pool, tasks out of the frontier are swapped, each group re-measures its task, and a resumed run continues the pool."
    model, tok = agent
    table, tasks = world
    cfg = RLConfig(**{**CFG, "rollout_batches": 2, "lr": 1e-3, "refresh_pool": True, "explore_per_batch": 0})
    rates = [{"id": t["id"], "passes": 2 if j % 2 else 0, "k": 4} for j, t in enumerate(tasks)]   # odd tasks in the frontier
    kw = dict(tokenizer=tok, toolbox=ToyToolBox(table), rates=rates, reward_fn=lambda t, a: float(a is not None))   # mixed groups
    with pytest.raises(ValueError, match="pass rates"): train_rl(_copy(model), tasks, tasks[:2], tmp_path / "none", cfg, tokenizer=tok)
    whole = train_rl(_copy(model), tasks, tasks[:2], tmp_path / "whole", cfg, **kw)
    part = train_rl(_copy(model), tasks, tasks[:2], tmp_path / "part", cfg, **kw)
    done_marker(part).unlink(); shutil.rmtree(part / "checkpoints" / "checkpoint-4")   # as if killed after the first rollout batch
    resumed = train_rl(_copy(model), tasks, tasks[:2], tmp_path / "part", cfg, **kw)
    assert read_json(resumed / "rl_curves.json") == read_json(whole / "rl_curves.json")
    pool_at_end = lambda d: read_json(d / "checkpoints" / "checkpoint-4" / "rl_state.json")["pool"]
    assert pool_at_end(resumed) == pool_at_end(whole)                         # the pool's estimates continued too
    rec = built_record(whole)
    assert rec["tasks"] == len(tasks) and rec["pool"]["frontier_start"] == len(tasks) // 2
    state = read_json(whole / "checkpoints" / "checkpoint-2" / "rl_state.json")["pool"]
    assert state["batch"] == 1
    first = [i for i, b in state["measured_at"].items() if b == 1]            # the tasks the first batch sampled ...
    assert first and all(tasks.index(next(t for t in tasks if t["id"] == i)) % 2 for i in first)   # ... were frontier tasks only
    assert all(state["latest"][i][1] == cfg.group_size for i in first)       # ... each re-measured by its group of G
