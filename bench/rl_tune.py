"""Choosing the RL stage's full profile on dev (never test): RL variants from one run's CoA SFT student and its selection.

Each variant is the full profile's `RLConfig` with some fields changed; it is trained in its own copy of the run dir
(sharing the SFT student and the data selection, which training settings do not change) and evaluated on `--per-kind`
dev tasks per kind with the SFT stage's harness: greedy, and avg@k (`--avg-k` samples per task at the variant's training
temperature). The SFT student is evaluated on the same tasks the same ways, and each variant is paired with it task by task.

    python bench/rl_tune.py --run-dir runs/full '{"lr1e-4": {"lr": 1e-4}, "T0.7": {"temperature": 0.7}}'
Writes bench/results/rl_tune.json: one section per SFT student (its fingerprint: a new student never reuses an older
student's numbers), one entry per variant (re-running a variant replaces its entry).
"""
from __future__ import annotations
import argparse, dataclasses, json, shutil, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "rl_tune.json"
NOT_COPIED = ("coa_rl", "rl_eval", "rl_tune", "ladder", "seeds", "notebooks", "html", "agentflow")   # RL reads none of these


def _sections(path: Path) -> dict:
    "The results file by student; a file written before students were told apart becomes the section 'earlier'."
    from coa_lib.core import read_json
    old = read_json(path) if path.exists() else {}
    return old if "by_student" in old else {"by_student": {"earlier": old} if old else {}}


def main() -> None:
    import torch
    from coa_lib.core import atomic_write_json, model_fingerprint, read_json
    from coa_lib.evaluate import eval_tasks, paired_records
    from coa_lib.rl import RLConfig
    from coa_lib.sft import SFTStageConfig
    from coa_lib.stage_rl import train_rl_student
    from coa_lib.stage_sft import eval_records, evaluate_student, sft_student, student_named
    from coa_lib.stage_tasks import build_task_splits
    from coa_lib.tasks import TaskConfig
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True, help="a run with a CoA SFT student (its selection is made if missing)")
    ap.add_argument("variants", help='JSON {name: {RLConfig field: value}}')
    ap.add_argument("--per-kind", type=int, default=50)
    ap.add_argument("--avg-k", type=int, default=4, help="samples per task for avg@k at the variant's temperature (0: greedy only)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    base, coa, sft_cfg = Path(a.run_dir), student_named("coa"), SFTStageConfig.for_profile("full")
    dev = eval_tasks(build_task_splits(base, TaskConfig.for_profile("full"))["dev"], a.per_kind)
    student = sft_student(base, "full")
    sections = _sections(OUT)
    results = sections["by_student"].setdefault(model_fingerprint(student), {"student": str(student)})
    summary = lambda m: {"accuracy": m["accuracy"], "by_kind": {k: v["accuracy"] for k, v in m["by_kind"].items()},
                         "invalid": m["invalid_rate"]}

    def evaluated(path, rd: Path, name: str, samples: int = 1, temperature: float = 0.0) -> dict:
        m, _ = evaluate_student(path, coa, dev, rd, name, sft_cfg, samples, temperature)
        return {"dev_tasks": len(dev), **summary(m)}

    def sft_at(temperature: float) -> str:     # the SFT student's avg@k at `temperature`, evaluated once (its records in the base run)
        key = f"sft_avg{a.avg_k}_T{temperature:g}"
        if key not in results: results[key] = evaluated(student, base, f"rl_tune/{key}", a.avg_k, temperature)
        return key

    results["sft"] = evaluated(student, base, "rl_tune/sft_dev")
    print("sft", json.dumps(results["sft"]), flush=True)
    for name, changes in json.loads(a.variants).items():
        cfg = dataclasses.replace(RLConfig.for_profile("full"), **changes)
        rd = base if not changes else base.parent / f"{base.name}_rl_{name}"   # the profile's own RL model is the run's
        if not rd.exists(): shutil.copytree(base, rd, ignore=shutil.ignore_patterns(*NOT_COPIED))
        t0 = time.perf_counter()
        path = train_rl_student(rd, cfg)
        wall = time.perf_counter() - t0
        entry = {"changes": changes, "train_s": round(wall, 1), **evaluated(path, rd, "rl_tune/rl_dev"),
                 "paired_greedy": paired_records(eval_records(rd, "rl_tune/rl_dev"), eval_records(base, "rl_tune/sft_dev"))}
        if a.avg_k:
            key = sft_at(cfg.temperature)
            entry[f"avg@{a.avg_k}"] = evaluated(path, rd, f"rl_tune/rl_avg{a.avg_k}", a.avg_k, cfg.temperature)
            entry[f"paired_avg@{a.avg_k}"] = paired_records(eval_records(rd, f"rl_tune/rl_avg{a.avg_k}"), eval_records(base, f"rl_tune/{key}"))
            entry[f"sft_avg@{a.avg_k}"] = results[key]["accuracy"]
        record = read_json(Path(str(path) + ".done"))
        entry["time_split"] = {k: round(v, 1) for k, v in record.items() if k.endswith("_s")}
        entry["curves"] = {k: read_json(path / "rl_curves.json")[k] for k in ("dev_accuracy", "sampled_reward")}
        results[name] = entry
        print(name, json.dumps({k: v for k, v in entry.items() if k != "curves"}), flush=True)
        atomic_write_json(OUT, sections)
    atomic_write_json(OUT, sections)


if __name__ == "__main__":
    main()
