"""What a base model has learned before SFT, on **dev** worlds (never trained on): quote loss and relation-reading accuracy.

Quote loss: nats per completion token of `coa_lib.sft.quote_rows` on dev-world pages (can it copy a cued span?).
Reading accuracy: greedy `coa_lib.reading.reading_accuracy` on reading rows of dev worlds (given pages and a question about
one relation of one entity, does it write the sentence that states it and the right answer, or "not found"?).
Comparison accuracy: the same on comparison rows of dev worlds (two entities' pages and a comparison question: does it
state both values and name the one the question picks?).

    python bench/reading_base.py --run-dir runs/ladder --base quote_tiny=runs/ladder/ladder/base_quote_tiny_2500 \\
        --base reading_tiny=runs/ladder/ladder/base_reading0.5_tiny_2500

Results are merged into bench/results/reading_base.json under each label (atomic write). The test split is never used.
"""
from __future__ import annotations
import argparse, json, os, time
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parent / "results" / "reading_base.json"


def measure(path: str, dev_split, n_quote: int, n_read: int, seed: int, n_compare: int = 0) -> dict:
    "Quote loss and reading accuracy of the model saved at `path`, on the dev split's worlds."
    from coa_lib.llm import load_policy
    from coa_lib.reading import reading_accuracy, reading_rows, task_worlds
    from coa_lib.sft import eval_loss, quote_rows
    from coa_lib.tokenizer import world_pages
    policy = load_policy(path)
    t0 = time.perf_counter()
    quotes = quote_rows(world_pages(dev_split, max_worlds=50), n_quote, seed=seed)
    reading = reading_rows(task_worlds(dev_split, max_worlds=50), n_read, seed=seed)
    out = {"path": str(path), "quote_loss": eval_loss(policy.model, policy.tokenizer, quotes), "n_quote_rows": n_quote,
           **{f"reading_{k}": v for k, v in reading_accuracy(policy, reading).items()}}
    if n_compare:
        compared = reading_rows(task_worlds(dev_split, max_worlds=50), n_compare, seed=seed, compare=1.0)
        out["comparison_accuracy"], out["n_compare_rows"] = reading_accuracy(policy, compared)["comparison_accuracy"], n_compare
    out["seconds"] = time.perf_counter() - t0
    from coa_lib.core import built_record
    if (done := built_record(path)) is not None: out["trained"] = {k: done.get(k) for k in ("global_step", "tokens_seen", "wall_s")}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", default="runs/ladder")
    ap.add_argument("--profile", default="full")
    ap.add_argument("--base", action="append", default=[], help="LABEL=PATH of a saved base model, repeatable")
    ap.add_argument("--n-quote", type=int, default=200)
    ap.add_argument("--n-read", type=int, default=300)
    ap.add_argument("--n-compare", type=int, default=200, help="comparison rows (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if not a.base: raise SystemExit("give at least one --base LABEL=PATH")
    torch.set_num_threads(a.threads)
    from coa_lib.core import atomic_write_json
    from coa_lib.stage_tasks import build_task_splits
    from coa_lib.tasks import TaskConfig
    dev = build_task_splits(a.run_dir, TaskConfig.for_profile(a.profile))["dev"]
    results = json.loads(OUT.read_text()) if OUT.exists() else {}
    for spec in a.base:
        label, sep, path = spec.partition("=")
        if not sep or not Path(path).is_dir(): raise SystemExit(f"--base {spec!r}: expected LABEL=PATH of a saved model directory")
        r = measure(path, dev, a.n_quote, a.n_read, a.seed, a.n_compare)
        r["load_avg"] = os.getloadavg()[0]
        results[label] = r
        print(f"{label}: quote loss {r['quote_loss']:.3f}  reading {r['reading_accuracy']:.3f} "
              f"(found {r['reading_found_accuracy']:.3f}, not found {r['reading_not_found_accuracy']})"
              + (f"  comparison {r['comparison_accuracy']:.3f}" if a.n_compare else ""), flush=True)
        atomic_write_json(OUT, results)


if __name__ == "__main__":
    main()
