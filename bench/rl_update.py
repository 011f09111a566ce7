"""What an RL update costs, by how it is cut: TRL's padded minibatch against `length_groups` pieces (`RLConfig.update_rows`).

Plays rollout batches of the full profile's size (8 tasks x 8 episodes, training temperature, the real tools) with a
trained CoA student on training tasks, splits each into the profile's minibatches as TRL does (shuffled), and times the
update's forward + backward pass of every minibatch under each way of cutting it, interleaved (so load on the machine
hits all alike). Every way's loss and gradient are compared with TRL's own (`_compute_loss` on the padded minibatch).

    python bench/rl_update.py --run-dir runs/ladder --model runs/ladder/ladder/mix_nano_quote_5M/phase0 --batches 3
Writes bench/results/rl_update.json (one entry per model; re-running replaces it).
"""
from __future__ import annotations
import argparse, dataclasses, statistics, tempfile, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "rl_update.json"


def main() -> None:
    import torch
    from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict
    from coa_lib.core import atomic_write_json, model_fingerprint, read_json
    from coa_lib.evaluate import eval_tasks
    from coa_lib.llm import load_policy
    from coa_lib.rl import RLConfig, _quiet_trl, build_rl_trainer
    from coa_lib.stage_tasks import build_task_splits
    from coa_lib.tasks import TaskConfig
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True, help="a run with built task splits (the training tasks are played)")
    ap.add_argument("--model", required=True, help="the CoA student (an HF model dir)")
    ap.add_argument("--batches", type=int, default=3, help="rollout batches to play and time")
    ap.add_argument("--rows", type=int, nargs="+", default=[0, 16, 8, 4], help="update_rows values to time (0: one unpadded piece)")
    ap.add_argument("--repeats", type=int, default=2, help="timings of each way per minibatch (the median is kept)")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = dataclasses.replace(RLConfig.for_profile("full"), threads=a.threads)
    train = build_task_splits(Path(a.run_dir), TaskConfig.for_profile("full"))["train"]
    tasks = eval_tasks(train, 8, ("multihop", "comparison", "mixed", "math", "game24", "code"))
    policy = load_policy(a.model)
    model, tok = policy.model, policy.tokenizer
    scratch = tempfile.TemporaryDirectory()      # TRL's output dir: nothing is saved
    trainer, ro, _ = build_rl_trainer(model.train(), tok, tasks, [], Path(scratch.name), cfg)
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps   # set by the training loop otherwise
    ways = {"trl_padded": None, **{f"rows_{r}": r for r in a.rows}}
    seconds = {w: [] for w in ways}
    worst = {w: 0.0 for w in ways}
    shapes = []
    for b in range(a.batches):
        prompts = [p for p in ro.prompts()[b * cfg.groups_per_batch:(b + 1) * cfg.groups_per_batch] for _ in range(cfg.group_size)]
        with _quiet_trl(): batch = trainer._generate_and_score_completions([{"prompt": p} for p in prompts])
        for mb in split_tensor_dict(shuffle_sequence_dict(batch), cfg.minibatches):
            real = int(mb["prompt_mask"].sum() + mb["completion_mask"].sum())
            padded = mb["prompt_mask"].numel() + mb["completion_mask"].numel()
            shapes.append({"episodes": mb["completion_ids"].shape[0], "padded_width": mb["prompt_ids"].shape[1] + mb["completion_ids"].shape[1],
                           "real_tokens": real, "padded_tokens": padded})
            ref = None
            for _ in range(a.repeats):
                for w, rows in ways.items():
                    if rows is not None: trainer.rollout_func.cfg = dataclasses.replace(cfg, update_rows=rows)
                    trainer.model.zero_grad()
                    t0 = time.perf_counter()
                    loss = trainer._compute_loss(trainer.model, mb) if rows is None else trainer.compute_loss(trainer.model, mb)
                    loss.backward()
                    seconds[w].append(time.perf_counter() - t0)
                    grads = torch.cat([q.grad.flatten() for q in trainer.model.parameters() if q.grad is not None])
                    if ref is None: ref = (loss.item(), grads)
                    else: worst[w] = max(worst[w], (grads - ref[1]).abs().max().item() / ref[1].abs().max().item(), abs(loss.item() - ref[0]))
        print(f"rollout batch {b + 1}/{a.batches}:", {w: round(sum(s) / a.repeats, 2) for w, s in seconds.items()}, flush=True)
    per_batch = {w: round(sum(s) / a.repeats / a.batches, 2) for w, s in seconds.items()}
    entry = {"model": str(a.model), "fingerprint": model_fingerprint(a.model), "threads": a.threads, "rollout_batches": a.batches,
             "minibatches_per_batch": cfg.minibatches, "episodes_per_batch": cfg.group_size * cfg.groups_per_batch,
             "update_s_per_rollout_batch": per_batch,
             "speedup_vs_trl": {w: round(per_batch["trl_padded"] / s, 2) for w, s in per_batch.items()},
             "median_s_per_minibatch": {w: round(statistics.median(s), 2) for w, s in seconds.items()},
             "max_rel_grad_or_loss_diff_vs_trl": worst,
             "real_token_share": round(sum(s["real_tokens"] for s in shapes) / sum(s["padded_tokens"] for s in shapes), 3),
             "minibatches": shapes, "rollout_s": [round(h["wall_s"], 1) for h in ro.history]}
    old = read_json(OUT) if OUT.exists() else {}
    old[entry["fingerprint"]] = entry
    atomic_write_json(OUT, old)
    print({k: v for k, v in entry.items() if k != "minibatches"})


if __name__ == "__main__":
    main()
