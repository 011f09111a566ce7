"""The smoke profile checks plumbing in minutes (issue 27: the whole smoke reproduction <= 5 min on an idle 2-core
machine, measured by `bench/smoke_time.py`, never timed here). These tests pin what keeps it so: a smoke run starts no
work that costs more than the stage itself (a spawned lane imports torch and transformers, ~6 CPU s each; the bf16
probe times eight training steps, more than the smoke base's four), and trains the toy agent once per run."""
import os

import pytest

from coa_lib.llm import build_tiny_qwen2
from coa_lib.sft import SFTStageConfig, choose_precision
from coa_lib.stage_sft import run_in_lanes
from coa_lib.tokenizer import build_tokenizer
from coa_lib.toy import ToyTrainConfig, toy_agent, toy_texts


def test_smoke_sft_lanes_run_in_this_process():
    "Students are trained and evaluated inline at smoke: no spawned lane (the committed smoke config spawned two, 8 times a run)."
    cfg = SFTStageConfig.for_profile("smoke")
    assert run_in_lanes(os.getpid, [(), (), ()], cfg.lanes, cfg.threads) == [os.getpid()] * 3


def test_smoke_sft_precision_is_configured_not_probed(monkeypatch):
    "The smoke SFT stage does not time fp32 against bf16 (every kernel that trained a base or a planner probed again)."
    import coa_lib.sft as sft
    monkeypatch.setattr(sft, "probe_precision", lambda *a, **k: pytest.fail("the smoke profile probed the precision"))
    tok = build_tokenizer(toy_texts(n_worlds=4), vocab_size=512)
    got = choose_precision(build_tiny_qwen2(tok, "nano"), tok, SFTStageConfig.for_profile("smoke"))
    assert got == {"bf16": False, "how": "configured"}


def test_toy_agent_trained_once_per_path(tmp_path, monkeypatch):
    "The toy agent `08_rollout` trains is saved in the run dir; `10_agentic_rl`'s call with the same config loads it."
    import coa_lib.toy as toy
    cfg = ToyTrainConfig(steps=2, batch_size=2, size="nano")
    _, _, losses = toy_agent(cfg, tmp_path / "toy_agent", progress=False)
    monkeypatch.setattr(toy, "build_toy_agent", lambda *a, **k: pytest.fail("trained the toy agent again"))
    model, tok, again = toy_agent(cfg, tmp_path / "toy_agent", progress=False)
    assert again == losses and not model.training and tok.pad_token is not None
