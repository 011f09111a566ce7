"""Tune the SFT stage on `dev`: train one student with a given budget and evaluate it on dev tasks, by kind.

The full profile's sizes (`coa_lib.sft.SFTStageConfig.for_profile("full")`) were chosen with this script, on the
**dev** split only (the test split is for the stage notebook's table). It trains one student of the run's SFT sets
(`coa_lib.stage_filter.build_sft_sets`, built at the run's profile when missing) through `coa_lib.sft.train_sft`, then rolls
it out with the real tools on the first `--n-dev` dev tasks of each kind (`coa_lib.evaluate.evaluate`, greedy).

    python bench/sft_probe.py --run-dir runs/full --set coa_sft --tokens 600000 [--batch 4] [--lr 2e-3] [--size tiny]
Prints training speed, loss and dev accuracy by kind; writes bench/results/sft_probe_<label>.json.
"""
from __future__ import annotations
import argparse, os, time
from dataclasses import asdict
from pathlib import Path

import torch

from coa_lib.core import atomic_write_json, built_record, read_json, resolve_run_dir
from coa_lib.evaluate import eval_tasks
from coa_lib.sft import SFTStageConfig, train_sft
from coa_lib.stage_sft import evaluate_student, STUDENTS

HERE = Path(__file__).resolve().parent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True, help="a run dir with (or to build) the SFT sets")
    ap.add_argument("--profile", default="full", help="the profile the run dir's sets are built at")
    ap.add_argument("--set", default="coa_sft", choices=[s.sft_set for s in STUDENTS])
    ap.add_argument("--tokens", type=int, default=600_000, help="token budget (processed tokens)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--base", default=None, help="continue from this saved model dir (e.g. runs/full/sft/coa) instead of a fresh --size model")
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="data order (and init) seed; use a new one to continue on other rows")
    ap.add_argument("--n-dev", type=int, default=10, help="dev tasks per kind")
    ap.add_argument("--label", default=None, help="name of the result (default from the settings)")
    ap.add_argument("--eval-every", type=int, default=0, help="also evaluate on dev every N steps during training (a learning curve)")
    ap.add_argument("--schedule", default="cosine", choices=["cosine", "constant_with_warmup"], help="learning-rate schedule (constant: a curve's points are comparable)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from coa_lib.stage_filter import build_sft_sets
    from coa_lib.llm import build_tiny_qwen2
    from coa_lib.stage_tasks import student_tokenizer
    from coa_lib.stage_tasks import build_task_splits
    from coa_lib.tasks import TaskConfig
    rd = resolve_run_dir(a.run_dir)
    student = next(s for s in STUDENTS if s.sft_set == a.set)
    label = a.label or f"{student.name}_{a.size}_{a.tokens // 1000}k_b{a.batch}_lr{a.lr:g}"
    cfg = SFTStageConfig.for_profile(a.profile)
    cfg.size, cfg.token_budget, cfg.batch_size, cfg.lr, cfg.max_len, cfg.warmup_steps = a.size, a.tokens, a.batch, a.lr, a.max_len, a.warmup
    cfg.seed = a.seed
    cfg.threads, cfg.save_steps, cfg.logging_steps, cfg.lr_schedule = a.threads, 50, 10, a.schedule
    rows = build_sft_sets(rd, a.profile, progress=False)[a.set]
    tok = student_tokenizer(rd, a.profile)
    load0 = os.getloadavg()[0]
    out = rd / "sft_probe" / label
    dev = eval_tasks(build_task_splits(rd, TaskConfig.for_profile(a.profile))["dev"], a.n_dev)
    curve, callbacks = [], []
    if a.eval_every:
        from transformers import TrainerCallback
        from coa_lib.llm import load_policy
        from coa_lib.evaluate import evaluate
        class DevCurve(TrainerCallback):
            "Dev accuracy of the live model every `eval_every` steps (greedy, the student's format)."
            def on_step_end(self, args, state, control, model=None, **kw):
                if state.global_step % a.eval_every: return
                model.eval()
                try:
                    m, _ = evaluate(load_policy(model, tok), dev, fmt=student.fmt, progress=False, limits=cfg.limits)
                finally: model.train()
                loss = next((h["loss"] for h in reversed(state.log_history) if "loss" in h), None)
                curve.append({"step": state.global_step, "tokens_seen": int(state.num_input_tokens_seen), "loss": loss, "dev_accuracy": m["accuracy"],
                              "by_kind": {k: v["accuracy"] for k, v in m["by_kind"].items()}, "invalid_rate": m["invalid_rate"]})
                print(f"step {state.global_step} tokens {state.num_input_tokens_seen:,} loss {loss} dev {m['accuracy']:.3f} invalid {m['invalid_rate']:.2f} "
                      + " ".join(f"{k[:4]} {v['accuracy']:.2f}" for k, v in m["by_kind"].items()), flush=True)
                atomic_write_json(HERE / "results" / f"sft_probe_{label}_curve.json", curve)
        callbacks.append(DevCurve())
    base = a.base if a.base else build_tiny_qwen2(tok, a.size, seed=cfg.seed)
    path = train_sft(rows, base, out, cfg, tokenizer=None if a.base else tok, callbacks=callbacks)
    done = built_record(path)
    history = read_json(path / "loss_history.json")
    t0 = time.perf_counter()
    metrics, _ = evaluate_student(path, student, dev, rd, f"sft_probe_eval/{label}", cfg)
    eval_s = time.perf_counter() - t0
    res = {"label": label, "set": a.set, "config": asdict(cfg), "load_avg_before": load0, "load_avg_after": os.getloadavg()[0],
           "train_wall_s": done["wall_s"], "tokens_seen": done["tokens_seen"], "steps": done["global_step"],
           "train_tokens_per_s": done["tokens_seen"] / done["wall_s"], "final_loss": history[-1]["loss"] if history else None,
           "train_loss": done["train_loss"], "dev_tasks": len(dev), "eval_wall_s": eval_s,
           "dev_accuracy": metrics["accuracy"], "dev_by_kind": {k: v["accuracy"] for k, v in metrics["by_kind"].items()},
           "invalid_rate": metrics["invalid_rate"], "mean_generated_tokens": metrics["mean_generated_tokens"],
           "mean_tool_calls": metrics["mean_tool_calls"], "generated_tokens_per_s": metrics["generated_tokens_per_s"], "curve": curve}
    print(f"{label}: {done['tokens_seen']:,} tokens in {done['wall_s']:.0f}s ({res['train_tokens_per_s']:,.0f} tok/s, load {load0:.1f}), "
          f"{done['global_step']} steps, last logged loss {res['final_loss']}")
    print(f"dev accuracy {metrics['accuracy']:.3f} on {len(dev)} tasks in {eval_s:.0f}s "
          f"({metrics['generated_tokens_per_s']:.0f} generated tok/s); invalid {metrics['invalid_rate']:.2f}; by kind "
          + ", ".join(f"{k} {v:.2f}" for k, v in res["dev_by_kind"].items()))
    atomic_write_json(HERE / "results" / f"sft_probe_{label}.json", res)


if __name__ == "__main__":
    main()
