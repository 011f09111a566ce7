"""RL variants from a ladder student (dev only, never test): `bench/rl_tune.py` for a student of `bench/sft_ladder.py`.

The student is the final model of ladder rung `--label` in `--run-dir` (its greedy record on the 300 dev tasks, kept
in `bench/results/ladder/<label>.json`, is the SFT side of every pairing). AFM's data selection is made once from it
(`stage_rl.afm_selection`: pass rates on `select_per_kind` training tasks per kind), then each variant (the full profile's `RLConfig` with some
fields changed) is trained with `train_rl` (resumable) and evaluated greedy on the same 50 dev tasks per kind.

    python bench/rl_ladder_tune.py --run-dir runs/ladder --label mix_nano_quote_5M '{"b20": {"rollout_batches": 20}, "b40": {"rollout_batches": 40}}'
Writes bench/results/rl_ladder_tune.json: one section per rung, one entry per variant (re-running replaces it).
"""
from __future__ import annotations
import argparse, dataclasses, json, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "rl_ladder_tune.json"


def main() -> None:
    import torch
    from coa_lib.core import atomic_write_json, read_json
    from coa_lib.evaluate import eval_tasks, paired_difference
    from coa_lib.rl import RLConfig, train_rl
    from coa_lib.stage_rl import afm_selection, rl_tasks
    from coa_lib.tokenizer import load_tokenizer
    from coa_lib.sft import SFTStageConfig
    from coa_lib.stage_sft import evaluate_student, student_named
    from coa_lib.stage_tasks import build_task_splits
    from coa_lib.tasks import TaskConfig
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True, help="the ladder's run dir (task splits, `ladder/<label>/phase0`)")
    ap.add_argument("--label", required=True, help="the ladder rung whose final model is the SFT student")
    ap.add_argument("variants", help='JSON {name: {RLConfig field: value}}')
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rd, student = Path(a.run_dir), Path(a.run_dir) / "ladder" / a.label / "phase0"
    sft_greedy = read_json(HERE / "results" / "ladder" / f"{a.label}.json")["final"]["greedy"]["reward_by_task"]
    splits = build_task_splits(rd, TaskConfig.for_profile("full"))
    base_cfg = dataclasses.replace(RLConfig.for_profile("full"), threads=a.threads)
    work = rd / "rl_ladder" / a.label
    sel_path = work / "selection.json"
    if not sel_path.exists():                     # the RL stage's selection rule, from the ladder student
        t0 = time.time()
        atomic_write_json(sel_path, {**afm_selection(student, splits["train"], base_cfg), "select_s": time.time() - t0})
    sel = read_json(sel_path)
    dev = eval_tasks(splits["dev"], 50)
    results = read_json(OUT) if OUT.exists() else {}
    section = results.setdefault(a.label, {"student": str(student), "sft_dev_greedy": sum(sft_greedy.values()) / len(sft_greedy),
                                           "selected": len(sel["selected"]), "pool": len(sel["pool"])})
    for name, changes in json.loads(a.variants).items():
        cfg = dataclasses.replace(base_cfg, **changes)
        tasks, rates = rl_tasks(sel, splits["train"], cfg, load_tokenizer(student))     # with refresh_pool: the whole pool
        path = train_rl(student, tasks, eval_tasks(splits["dev"], cfg.n_dev), work / name, cfg, rates=rates)
        m, recs = evaluate_student(path, student_named("coa"), dev, rd, f"rl_ladder/{a.label}/eval_{name}", SFTStageConfig.for_profile("full"))
        rl_greedy = dict(zip(recs["task_id"], recs["reward"]))
        shared = sorted(set(rl_greedy) & set(sft_greedy))
        done = read_json(Path(str(path) + ".done"))
        section[name] = {"changes": changes, "rollout_batches": cfg.rollout_batches,
                         "dev_greedy": m["accuracy"], "ci95": m["accuracy_ci95"], "by_kind": {k: v["accuracy"] for k, v in m["by_kind"].items()},
                         "invalid": m["invalid_rate"], "paired_vs_sft": paired_difference([rl_greedy[t] for t in shared], [sft_greedy[t] for t in shared]),
                         "time_split": {k: round(v, 1) for k, v in done.items() if isinstance(v, (int, float)) and k.endswith("_s")},
                         "dev_curve": read_json(path / "rl_curves.json")["dev_accuracy"]}
        atomic_write_json(OUT, results)
        print(name, json.dumps({k: v for k, v in section[name].items() if k != "dev_curve"}), flush=True)


if __name__ == "__main__":
    main()
