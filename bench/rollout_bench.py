"""Rollout throughput: the KV-cache engine of coa_lib.rollout against a naive loop on the same tiny Qwen2.

The naive loop runs one episode at a time and calls `model.generate` on the whole history every turn (what
`coa_lib.rollout.naive_rollout` does); the engine batches episodes in one KV cache, continues it across turns and
refills finished rows. Same model, tasks, greedy decoding and budgets; the outputs must be identical token for token.

The model is a tiny Qwen2 (coa_lib.llm.build_tiny_qwen2, size "tiny": hidden 256, 4 layers, ~3.9M params with the toy
tokenizer) trained for a few hundred steps on the toy lookup format of coa_lib.rollout (`<web_search>name</web_search>`
-> that name's entry; answer = a code), so its episodes call tools and take several turns. The trained model is
cached in a temp dir keyed by its config.

    python bench/rollout_bench.py [--tasks 64] [--batch-size 32] [--threads N] [--steps 200] [--train-batch 8]
Prints both generated tokens/s and their ratio; writes bench/results/rollout_bench.json.
"""
from __future__ import annotations
import argparse, os, platform, tempfile, time
from dataclasses import asdict
from collections import Counter
from pathlib import Path

import torch

from coa_lib.core import atomic_write_json, stable_hash
from coa_lib.llm import build_tiny_qwen2
from coa_lib.tokenizer import build_tokenizer
from coa_lib.episode import Limits
from coa_lib.rollout import naive_rollout, rollout
from coa_lib.toy import toy_tasks, toy_texts, toy_world, ToyToolBox, ToyTrainConfig, train_toy_agent

HERE = Path(__file__).resolve().parent


def toy_agent(cfg: ToyTrainConfig):
    "The trained toy agent, from the cache when it was trained before with the same config."
    from transformers import AutoTokenizer, Qwen2ForCausalLM
    cache = Path(tempfile.gettempdir()) / f"coa-lab-bench-toy-agent-{stable_hash(vars(cfg))}"
    if (cache / "done").exists():
        return Qwen2ForCausalLM.from_pretrained(cache).eval(), AutoTokenizer.from_pretrained(cache), None
    tok = build_tokenizer(toy_texts(seed=cfg.seed), vocab_size=2048)
    model = build_tiny_qwen2(tok, size=cfg.size, seed=cfg.seed)
    t0 = time.perf_counter()
    losses = train_toy_agent(model, tok, cfg, progress=True)
    train_s = time.perf_counter() - t0
    model.save_pretrained(cache); tok.save_pretrained(cache); (cache / "done").write_text("ok")
    return model.eval(), tok, {"train_s": train_s, "loss_first": losses[0], "loss_last10": sum(losses[-10:]) / 10}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--steps", type=int, default=200, help="toy training steps")
    ap.add_argument("--train-batch", type=int, default=8, help="toy training sequences per step")
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--out", default=str(HERE / "results" / "rollout_bench.json"))
    a = ap.parse_args(argv)
    if a.threads: torch.set_num_threads(a.threads)
    cfg = ToyTrainConfig(steps=a.steps, batch_size=a.train_batch, size="tiny")
    model, tok, train = toy_agent(cfg)
    world = toy_world(4242)
    tasks = toy_tasks(world, a.tasks, seed=17)
    budget = Limits(max_turns=a.max_turns, max_new_tokens=a.max_new_tokens, max_total_tokens=512)
    load0 = os.getloadavg()

    stats = {}
    t0 = time.perf_counter()
    fast = rollout((model, tok), tasks, toolbox=ToyToolBox(world), batch_size=a.batch_size, progress=False, stats=stats, limits=budget)
    t_fast = time.perf_counter() - t0
    t0 = time.perf_counter()
    slow = naive_rollout(model, tok, tasks, toolbox=ToyToolBox(world), progress=True, limits=budget)
    t_slow = time.perf_counter() - t0

    gen = sum(e.generated_tokens for e in fast)
    res = {
        "model": {"size": cfg.size, "params": sum(p.numel() for p in model.parameters()), "vocab": len(tok),
                  "train_steps": cfg.steps, "train_batch": cfg.batch_size, "train": train},
        "setup": {"tasks": len(tasks), "batch_size": a.batch_size, **asdict(budget), "greedy": True,
                  "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(), "loadavg_before": load0,
                  "loadavg_after": os.getloadavg(), "python": platform.python_version(), "torch": torch.__version__},
        "identical_outputs": [e.token_ids for e in fast] == [e.token_ids for e in slow],
        "generated_tokens": gen,
        "kv_engine": {"wall_s": t_fast, "generated_tokens_per_s": gen / t_fast,
                      "processed_tokens": sum(e.processed_tokens for e in fast), **stats},
        "naive_loop": {"wall_s": t_slow, "generated_tokens_per_s": sum(e.generated_tokens for e in slow) / t_slow,
                       "processed_tokens": sum(e.processed_tokens for e in slow)},
        "episodes": {"mean_turns": sum(e.turns for e in fast) / len(fast),
                     "mean_tool_calls": sum(len(e.tool_calls) for e in fast) / len(fast),
                     "accuracy": sum(e.reward >= 1 for e in fast) / len(fast),
                     "finish": dict(Counter(e.finish.value for e in fast))},
    }
    res["speedup"] = res["kv_engine"]["generated_tokens_per_s"] / res["naive_loop"]["generated_tokens_per_s"]
    print(f"generated tokens: {gen} (identical outputs: {res['identical_outputs']}); "
          f"mean turns {res['episodes']['mean_turns']:.2f}, tool calls {res['episodes']['mean_tool_calls']:.2f}")
    print(f"KV engine : {res['kv_engine']['generated_tokens_per_s']:8.1f} generated tok/s ({t_fast:.1f}s)")
    print(f"naive loop: {res['naive_loop']['generated_tokens_per_s']:8.1f} generated tok/s ({t_slow:.1f}s)")
    print(f"speedup   : {res['speedup']:.2f}x   (torch threads {torch.get_num_threads()}, load {load0[0]:.1f})")
    atomic_write_json(a.out, res)
    return res


if __name__ == "__main__":
    main()
