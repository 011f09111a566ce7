"""Held-out copy losses of saved students (dev only): nats per token on the copied spans of teacher dev trajectories.

`coa_lib.sft.copy_token_losses` on `held_out_dev_rows` (what the ladder measures) for any saved model, with the run's
own tokenizer, so a stage's students and a ladder rung are compared on the same rows:

    python bench/copy_loss.py --run-dir runs/full runs/full/sft/coa runs/ladder/ladder/<rung>/phase0

Prints one line per model and writes bench/results/copy_loss.json.
"""
import argparse
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", help="saved model directories (default: every model under RUN_DIR/sft)")
    ap.add_argument("--run-dir", default="runs/full")
    ap.add_argument("--profile", default="full")
    ap.add_argument("--kinds", default="multihop", help="comma-separated task kinds of the dev rows")
    ap.add_argument("--rows", type=int, default=40)
    a = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM
    from coa_lib.core import atomic_write_json
    from coa_lib.stage_tasks import student_tokenizer
    from coa_lib.sft import copy_token_losses
    from coa_lib.stage_sft import held_out_dev_rows
    torch.set_num_threads(2)
    models = a.models or sorted(str(p.parent) for p in Path(a.run_dir).glob("sft/*/model.safetensors"))
    if not models: raise SystemExit(f"no saved models given or found under {a.run_dir}/sft")
    tok = student_tokenizer(a.run_dir, a.profile)
    rows = held_out_dev_rows(Path(a.run_dir), a.profile, tuple(a.kinds.split(",")), a.rows)
    out = {"run_dir": a.run_dir, "kinds": a.kinds, "rows": len(rows), "models": {}}
    for m in models:
        losses = copy_token_losses(AutoModelForCausalLM.from_pretrained(m).eval(), tok, rows)
        out["models"][m] = {k: round(v, 3) for k, v in losses.items()}
        print(m, out["models"][m], flush=True)
    atomic_write_json(HERE / "results" / "copy_loss.json", out)


if __name__ == "__main__":
    main()
