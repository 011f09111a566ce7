"""How fast can the student learn to copy? A synthetic induction probe behind two choices of the SFT stage.

A fresh Qwen2 (`--size`, from `coa_lib.llm.build_tiny_qwen2`) is trained on one task only: a random span of 12 units
appears, then random filler of random length, then a marker, then the span again; the loss is taken on the second copy
(the units of the span). Offsets vary from row to row, so a fixed-position shortcut does not work: only a real copy
circuit (an induction head: find where the current token occurred before, emit what followed it) brings the loss down.
Variants (what a unit is):

- `distinct`: one token drawn from 1,200 ids (a word or a group of digits under the chosen pre-tokenizer);
- `spaced`: a token from 1,200 ids followed by one fixed "space" token (what isolated-space pieces produce);
- `digits`: one token from 10 ids (digits one by one).

Chance is ln(1200) ≈ 7.09 nats (ln 10 ≈ 2.30 for `digits`). Measured at two learning rates; prints the loss every 100
steps and writes bench/results/induction_probe.json and .png.

    python bench/induction_probe.py [--steps 1500] [--variants distinct:1e-3 spaced:1e-3 digits:1e-3 distinct:3e-3]
"""
from __future__ import annotations
import argparse, json, math, os, random, time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
VOCAB, SEP, MARK, SPACE = range(300, 1500), 5, 6, 224


def batch(variant: str, rng: random.Random, size: int, span: int = 12, max_gap: int = 16):
    "One batch: (input ids, labels) with -100 everywhere but the second copy's units; right-padded."
    rows, labels = [], []
    for _ in range(size):
        if variant == "digits": units = [rng.randrange(10) + 400 for _ in range(span)]
        else: units = [rng.choice(VOCAB) for _ in range(span)]
        x = [t for u in units for t in ((u, SPACE) if variant == "spaced" else (u,))]
        pre = [rng.choice(VOCAB) for _ in range(rng.randint(0, max_gap))]
        gap = [rng.choice(VOCAB) for _ in range(rng.randint(0, max_gap))]
        seq = pre + x + [SEP] + gap + [MARK] + x
        lab = [-100] * (len(seq) - len(x)) + [t if t != SPACE else -100 for t in x]
        rows.append(seq); labels.append(lab)
    w = max(map(len, rows))
    return (torch.tensor([r + [0] * (w - len(r)) for r in rows]), torch.tensor([l + [-100] * (w - len(l)) for l in labels]),
            torch.tensor([[1] * len(r) + [0] * (w - len(r)) for r in rows]))


def run(variant: str, lr: float, size: str, steps: int, batch_size: int, seed: int, tok) -> dict:
    from transformers import Qwen2ForCausalLM
    from coa_lib.llm import qwen2_config
    torch.manual_seed(seed); rng = random.Random(seed)
    model = Qwen2ForCausalLM(qwen2_config(tok, size, vocab_size=2048)).train()     # the student's shape at vocab 2,048
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    curve, t0, window = [], time.perf_counter(), []
    for step in range(1, steps + 1):
        ids, lab, att = batch(variant, rng, batch_size)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step(); opt.zero_grad(set_to_none=True)
        window.append(float(loss))
        if step % 100 == 0:
            curve.append({"step": step, "loss": sum(window) / len(window)}); window = []
            print(f"{variant:>8} lr {lr:g} step {step:>5} loss {curve[-1]['loss']:.3f}", flush=True)
    chance = math.log(10 if variant == "digits" else len(VOCAB))
    return {"variant": variant, "lr": lr, "size": size, "batch": batch_size, "steps": steps, "chance_nats": chance,
            "final_loss": curve[-1]["loss"], "wall_s": time.perf_counter() - t0, "curve": curve}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", default="nano")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variants", nargs="+", default=["distinct:1e-3", "spaced:1e-3", "digits:1e-3", "distinct:3e-3"])
    ap.add_argument("--out", default=str(HERE / "results" / "induction_probe.json"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from coa_lib.tokenizer import build_tokenizer
    tok = build_tokenizer(["a b c"] * 3, vocab_size=400)       # only its special ids are used; the model's vocabulary is 2,048
    out = Path(a.out)
    res = json.loads(out.read_text()) if out.exists() else {"runs": []}
    res.update(machine=os.uname().machine, torch=torch.__version__, threads=a.threads)
    for spec in a.variants:
        variant, lr = spec.split(":")
        r = run(variant, float(lr), a.size, a.steps, a.batch, a.seed, tok)
        res["runs"] = [x for x in res["runs"] if (x["variant"], x["lr"], x["size"]) != (variant, float(lr), a.size)] + [r]
        from coa_lib.core import atomic_write_json
        atomic_write_json(out, res)
    import matplotlib; matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in res["runs"]:
        ax.plot([c["step"] for c in r["curve"]], [c["loss"] / r["chance_nats"] for c in r["curve"]], marker=".",
                label=f"{r['variant']} lr {r['lr']:g} ({r['size']})")
    ax.set(xlabel="optimizer step (batch 16)", ylabel="copy loss / chance", title="Induction probe: learning to copy a span")
    ax.axhline(1.0, color="gray", lw=0.8, ls="--"); ax.legend(fontsize=8); fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110); plt.close(fig)
    for r in res["runs"]: print(f"{r['variant']:>8} lr {r['lr']:g} {r['size']}: final loss {r['final_loss']:.3f} (chance {r['chance_nats']:.2f})")


if __name__ == "__main__":
    main()
