"""Flow-GRPO (`coa_lib.flow_grpo`): the loss and its gradient equal a calculation written out token by token; a group whose
rewards are equal gives every model parameter exactly zero gradient; every planner turn of a flow carries the flow's
advantage and the weights sum to one; an interrupted training run resumes to the same planner."""
import math
from dataclasses import replace

import pytest
import torch

from coa_lib.agentflow import AF_KINDS, FlowLimits, ModelPlanner, solve
from coa_lib.core import built_record, read_json
from coa_lib.flow_grpo import FlowGRPOConfig, TurnSample, flow_grpo_loss, group_advantages, token_logprobs, train_flow_grpo, turn_samples
from coa_lib.llm import build_tiny_qwen2
from coa_lib.rollout import pad_id
from coa_lib.scripted_flow import scripted_modules
from coa_lib.tasks import make_task_suite
from coa_lib.tokenizer import build_tokenizer, tokenizer_texts


@pytest.fixture(scope="module")
def world():
    tasks = [dict(t) for t in make_task_suite(AF_KINDS, 2, "dev", seed=5, worlds_per_split=2)]
    tok = build_tokenizer(tokenizer_texts(tasks), vocab_size=400)
    return tasks, tok, build_tiny_qwen2(tok, "nano", seed=3).eval()


def _by_hand(rows, eps_lo, eps_hi, beta):
    "rows: (logp, old, ref, A, weight-of-turn, tokens-in-turn) per token; the loss and d loss / d logp in plain floats."
    loss, grads = 0.0, []
    for lp, old, ref, a, w, n in rows:
        rho = math.exp(lp - old)
        clipped = min(max(rho, 1 - eps_lo), 1 + eps_hi)
        pg, dpg = (-rho * a, -rho * a) if rho * a <= clipped * a else (-clipped * a, 0.0)
        kl, dkl = math.exp(ref - lp) - (ref - lp) - 1, 1 - math.exp(ref - lp)
        loss += w / n * (pg + beta * kl); grads.append(w / n * (dpg + beta * dkl))
    return loss, grads


@pytest.mark.parametrize("eps_hi,beta", [(0.2, 0.001), (0.3, 0.001), (0.3, 0.0)])
def test_loss_and_gradient_by_hand(eps_hi, beta):
    # two groups of G = 3; flows with 1, 2 or 3 planner turns; turns of 1 to 4 tokens
    rewards = [1, 0, 0, 0, 1, 1]
    turns_of = {0: [3], 1: [1, 4], 2: [2, 2, 1], 3: [4], 4: [1, 1], 5: [2]}
    adv = group_advantages(rewards, 3)
    g = torch.Generator().manual_seed(7)
    K = 4
    rows, meta = [], []
    for flow, lens in turns_of.items():
        for n in lens: rows.append(n); meta.append((flow, len(lens)))
    N = len(rows)
    lp = -torch.rand(N, K, generator=g, dtype=torch.float64) - 0.2
    old = lp + 0.3 * torch.randn(N, K, generator=g, dtype=torch.float64)       # ratios from 0.5 to 2: both clips act
    ref = lp + 0.2 * torch.randn(N, K, generator=g, dtype=torch.float64)
    mask = torch.zeros(N, K, dtype=torch.float64)
    for i, n in enumerate(rows): mask[i, K - n:] = 1
    A = torch.tensor([adv[f] for f, _ in meta], dtype=torch.float64)
    W = torch.tensor([1 / (2 * 3 * T) for _, T in meta], dtype=torch.float64)  # 1/groups · 1/G · 1/T_i
    lp.requires_grad_(True)
    loss, stats = flow_grpo_loss(lp, old, ref, mask, A, W, 0.2, eps_hi, beta)
    loss.backward()
    cells = [(i, c) for i, n in enumerate(rows) for c in range(K - n, K)]
    hand_loss, hand_grad = _by_hand([(float(lp[i, c]), float(old[i, c]), float(ref[i, c]), float(A[i]), float(W[i]), rows[i])
                                     for i, c in cells], 0.2, eps_hi, beta)
    assert float(loss) == pytest.approx(hand_loss, rel=1e-12, abs=1e-15)
    assert [float(lp.grad[i, c]) for i, c in cells] == pytest.approx(hand_grad, rel=1e-10, abs=1e-15)
    assert all(float(lp.grad[i, c]) == 0.0 for i in range(N) for c in range(K - rows[i]))     # padding: no gradient
    assert 0 < stats["clip_frac"] < 1


def test_equal_reward_group_gives_zero_gradient(world):
    tasks, tok, model = world
    batch = [t for t in tasks[:2] for _ in range(3)]
    recs = solve(batch, scripted_modules(batch, planner=ModelPlanner(model, tok), tokenizer=tok), 2, FlowLimits(temperature=1.0), seed=1)
    samples, _ = turn_samples(recs, 3)
    same = [TurnSample(s.prompt_ids, s.completion_ids, 0.0, s.weight, s.group) for s in samples]   # a group whose rewards are equal
    assert group_advantages([1, 1, 1], 3) == [0.0, 0.0, 0.0] and group_advantages([0, 0, 0], 3) == [0.0, 0.0, 0.0]
    for beta in (0.0, 0.001):
        model.zero_grad()
        lp, mask = token_logprobs(model, same, pad_id(tok))
        loss, _ = flow_grpo_loss(lp, lp.detach() + 0.05, lp.detach(), mask, torch.zeros(len(same)),
                                 torch.tensor([s.weight for s in same]), beta=beta)
        loss.backward()
        assert all(p.grad is None or p.grad.abs().max() == 0 for p in model.parameters())
    model.zero_grad()
    lp, mask = token_logprobs(model, samples, pad_id(tok))
    moving = [TurnSample(s.prompt_ids, s.completion_ids, 1.0 if s.group == 0 else -1.0, s.weight, s.group) for s in samples]
    loss, _ = flow_grpo_loss(lp, lp.detach(), None, mask, torch.tensor([s.advantage for s in moving]), torch.tensor([s.weight for s in moving]))
    loss.backward()
    assert max(p.grad.abs().max() for p in model.parameters() if p.grad is not None) > 0     # the test can fail
    model.zero_grad()


def test_turn_samples_broadcast_the_outcome(world):
    tasks, tok, model = world
    batch = [t for t in tasks[:3] for _ in range(4)]
    recs = solve(batch, scripted_modules(batch, planner=ModelPlanner(model, tok), tokenizer=tok), 3, FlowLimits(temperature=1.0), seed=2)
    for j, r in enumerate(recs): r.reward = float(j % 3 == 0)        # mixed outcomes in every group
    samples, adv = turn_samples(recs, 4)
    assert sum(s.weight for s in samples) == pytest.approx(1.0)
    k = 0
    for j, r in enumerate(recs):
        for t in r.planner_turns:
            s = samples[k]; k += 1
            assert (s.advantage, s.group, s.completion_ids) == (adv[j], j // 4, t["completion_ids"])
            assert s.weight == pytest.approx(1 / (3 * 4 * len(r.planner_turns)))
    assert k == len(samples)


def test_resume_gives_the_same_planner(world, tmp_path):
    "A run that dies after its first checkpoint, run again with the same settings, resumes there and ends where an unbroken run ends."
    from coa_lib.flow_grpo import default_modules
    tasks, tok, model = world
    model.save_pretrained(str(tmp_path / "warm")); tok.save_pretrained(str(tmp_path / "warm"))
    cfg = replace(FlowGRPOConfig.for_profile("smoke"), steps=2, save_every=1, lr=1e-2)
    straight = train_flow_grpo(tmp_path / "warm", tasks[:4], tmp_path / "straight", cfg, progress=False)
    calls = []
    def dies_in_step_2(batch, planner):
        calls.append(1)
        if len(calls) == 2: raise KeyboardInterrupt("killed in the second rollout batch")
        return default_modules(batch, planner)
    with pytest.raises(KeyboardInterrupt):
        train_flow_grpo(tmp_path / "warm", tasks[:4], tmp_path / "resumed", cfg, make_modules=dies_in_step_2, progress=False)
    assert (tmp_path / "resumed" / "checkpoint" / "trainer_state.pt").exists() and built_record(tmp_path / "resumed") is None
    calls.clear()
    resumed = train_flow_grpo(tmp_path / "warm", tasks[:4], tmp_path / "resumed", cfg, make_modules=dies_in_step_2, progress=False)
    assert len(calls) == 1                                                   # only step 2 ran again: step 1 came from the checkpoint
    h1, h2 = read_json(straight / "flow_grpo_curves.json"), read_json(resumed / "flow_grpo_curves.json")
    assert [h["reward"] for h in h1] == [h["reward"] for h in h2] and len(h1) == 2
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    board = EventAccumulator(str(resumed / "tensorboard")); board.Reload()      # the curves in TensorBoard too, once per step
    assert [e.step for e in board.Scalars("flow_grpo/reward")] == [1, 2]
    assert [e.value for e in board.Scalars("flow_grpo/reward")] == pytest.approx([h["reward"] for h in h2])
    from transformers import AutoModelForCausalLM
    a, b = (AutoModelForCausalLM.from_pretrained(str(p)) for p in (straight, resumed))
    w0 = AutoModelForCausalLM.from_pretrained(str(tmp_path / "warm"))
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a.parameters(), b.parameters()))
    assert any(not torch.equal(x, y) for x, y in zip(a.parameters(), w0.parameters()))         # it did train
