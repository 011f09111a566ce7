"""AgentFlow + Flow-GRPO on an accelerator (CUDA when there is one, else the CPU): the KV-cache planner decodes like HF
`generate` there, `solve` runs with the planner on the device, and two Flow-GRPO rollout batches train it there (model,
reference and optimizer on the device).
Prints what it measured and writes bench/results/gpu_flow_check.json (or $OUT/gpu_flow_check.json when OUT is set).
Search kinds only: the code sandbox needs bubblewrap, which a bare GPU machine may lack.

    python bench/gpu_flow_check.py
"""
import json, os, tempfile, time
from dataclasses import replace
from pathlib import Path

import torch

from coa_lib.agentflow import ModelPlanner, flow_metrics, solve
from coa_lib.rollout import kv_generate
from coa_lib.core import read_json
from coa_lib.flow_grpo import FlowGRPOConfig, train_flow_grpo
from coa_lib.llm import build_tiny_qwen2
from coa_lib.scripted_flow import scripted_modules
from coa_lib.tasks import make_task_suite
from coa_lib.tokenizer import build_tokenizer, tokenizer_texts


def main() -> None:
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    out = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__}
    tasks = [dict(t) for t in make_task_suite(("multihop", "comparison"), 16, "dev", seed=1, worlds_per_split=4)]
    tok = build_tokenizer(tokenizer_texts(tasks), vocab_size=1024)
    model = build_tiny_qwen2(tok, "nano", seed=0).to(dev).eval()
    prompts = [f"<|im_start|>user\n{t['question']}<|im_end|>\n<|im_start|>assistant\n" for t in tasks]
    turns = kv_generate(model, tok, prompts, 16, ["</tool>"], batch_size=8)
    same = 0
    for t in turns:
        ids = torch.tensor([t.prompt_ids], device=dev)
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(t.completion_ids), do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        same += ref[0, ids.shape[1]:].tolist() == t.completion_ids
    out["kv_equals_generate"] = f"{same}/{len(turns)}"
    big = prompts * 16
    sync(); t0 = time.perf_counter()
    turns = kv_generate(model, tok, big, 48, [], temperature=1.0, batch_size=256)
    sync(); wall = time.perf_counter() - t0
    out["kv_generate_tokens_per_s"] = sum(len(t.completion_ids) for t in turns) / wall
    recs = solve(tasks, scripted_modules(tasks, planner=ModelPlanner(model, tok), tokenizer=tok), 3)
    out["solve"] = {k: flow_metrics(recs)[k] for k in ("accuracy", "turns", "tool_error_rate")}
    with tempfile.TemporaryDirectory() as tmp:
        model.cpu().save_pretrained(f"{tmp}/warm"); tok.save_pretrained(f"{tmp}/warm")
        cfg = replace(FlowGRPOConfig.for_profile("smoke"), steps=2, lr=1e-3)
        t0 = time.perf_counter()
        path = train_flow_grpo(f"{tmp}/warm", tasks, f"{tmp}/fg", cfg, progress=False)
        out["flow_grpo_s"] = time.perf_counter() - t0
        out["flow_grpo_curves"] = read_json(Path(path) / "flow_grpo_curves.json")
    if cuda: out["max_memory_mib"] = torch.cuda.max_memory_allocated() / 2**20
    print(json.dumps(out, indent=1))
    dest = Path(os.environ["OUT"]) if os.environ.get("OUT") else Path(__file__).parent / "results"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "gpu_flow_check.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
