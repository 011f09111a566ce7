"""Training throughput of the tiny student on this machine: fp32 vs bf16 autocast, and model FLOP utilisation.

Measured in one run, on the same threads:
1. the matrix-multiply peak (square GEMMs, fp32 and bf16), the denominator of the FLOP utilisation;
2. training tokens/s (of the median step) of the tiny Qwen2 (coa_lib.llm size "tiny": hidden 256, 4 layers, vocab 2,048; ~3.9M params),
   a plain loop (forward, backward, AdamW step) on fixed-length batches of real SFT rows (the smoke run's CoA set,
   observations masked), fp32 and under `torch.autocast("cpu", torch.bfloat16)`;
3. the loss both precisions reach after the same steps on the same batches (does bf16 still train as well?);
4. the same through `coa_lib.sft.train_sft` (TRL SFTTrainer, fp32 vs bf16=True): the speed the pipeline really gets.

FLOPs per trained token = 6 * N (N = parameters in matmuls: the blocks plus the tied LM head) + 6 * layers * hidden *
sequence length (attention scores and values under a causal mask: half of the 12 * L * d * T of full attention). The
peak is the best of square GEMMs and the model's own GEMM shapes. The machine's load average is recorded before and after: the box is
shared, so read the numbers next to it.

    python bench/train_bench.py [--threads 2] [--seconds 20] [--batch 8] [--seq 512] [--run-dir DIR]
Prints the figures; writes bench/results/train_bench.json.
"""
from __future__ import annotations
import argparse, os, platform, tempfile, time
from pathlib import Path

import torch

from coa_lib.core import atomic_write_json, resolve_run_dir
from coa_lib.llm import build_tiny_qwen2, n_params
from coa_lib.sft import IGNORE, SFTStageConfig, tokenize_sft, train_sft

HERE = Path(__file__).resolve().parent


def matmul_gflops(dtype: torch.dtype, m: int, k: int, n: int, seconds: float) -> float:
    "GFLOP/s of (m x k) @ (k x n) products in `dtype`."
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    a @ b
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or reps < 2:
        a @ b; reps += 1
    return 2 * m * k * n * reps / (time.perf_counter() - t0) / 1e9


PEAK_SHAPES = ((1024, 1024, 1024), (4096, 256, 768), (512, 256, 768), (512, 768, 256), (2048, 2048, 2048), (4096, 256, 2048))


def matmul_peak(dtype: torch.dtype, seconds: float = 1.0) -> float:
    "The best GFLOP/s over square GEMMs and the model's own training shapes (1 or 8 rows x 512 tokens, hidden 256, ffn 768, vocab 2,048)."
    shapes = PEAK_SHAPES if dtype == torch.float32 else PEAK_SHAPES[:4]   # bf16 can be very slow: skip the big ones
    return max(matmul_gflops(dtype, *s, seconds) for s in shapes)


def batches(train, batch: int, seq: int, pad_id: int):
    "Fixed-length (seq) training batches cut from the tokenized rows, cycled."
    ids, labels = [], []
    for r in train:
        ids.append((r["input_ids"] + [pad_id] * seq)[:seq]); labels.append((r["labels"] + [IGNORE] * seq)[:seq])
    i = 0
    while True:
        sel = [(i + j) % len(ids) for j in range(batch)]; i += batch
        yield torch.tensor([ids[j] for j in sel]), torch.tensor([labels[j] for j in sel])


def train_loop(tok, train, bf16: bool, batch: int, seq: int, seconds: float, steps: int | None = None) -> dict:
    "Tokens/s of forward+backward+AdamW on the tiny model; stops after `seconds` (or exactly `steps`)."
    model = build_tiny_qwen2(tok, "tiny", seed=0).train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    data, losses = batches(train, batch, seq, tok.pad_token_id), []
    def step():
        x, y = next(data)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=x, labels=y).loss
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    step()   # warm-up, not timed
    load = os.getloadavg()[0]
    k, t0, times = 0, time.perf_counter(), []
    while (steps is None and (time.perf_counter() - t0 < seconds or k < 3)) or (steps is not None and k < steps):
        a = time.perf_counter(); step(); times.append(time.perf_counter() - a); k += 1
    dt = time.perf_counter() - t0
    median = sorted(times)[len(times) // 2]
    n = n_params(model)
    flops_per_token = 6 * n + 6 * model.config.num_hidden_layers * model.config.hidden_size * seq
    tps = batch * seq / median   # the median step: robust to another job's burst on a shared machine
    return {"bf16": bf16, "load_avg_1min": load, "steps": k, "seconds": dt, "tokens_per_s": tps, "tokens_per_s_mean": k * batch * seq / dt, "params": n, "flops_per_token": flops_per_token,
            "tflops": tps * flops_per_token / 1e12, "losses": losses}


class _Clock:
    "Step-end times and tokens seen, to time the steady state of a Trainer run (set-up and warm-up step excluded)."
    def __init__(self): self.marks = []
    def as_callback(self):
        from transformers import TrainerCallback
        marks = self.marks
        class C(TrainerCallback):
            def on_step_end(self, args, state, control, **kw): marks.append((time.perf_counter(), state.num_input_tokens_seen))
        return C()


def pipeline(tok, rows, bf16: bool, steps: int, out: Path) -> dict:
    "train_sft (TRL SFTTrainer) tokens/s in the steady state (after the first step) over `steps` steps."
    cfg = SFTStageConfig(size="tiny", batch_size=8, max_len=512, max_steps=steps, threads=torch.get_num_threads(),
                         save_steps=10_000, logging_steps=1, bf16=bf16)
    load, clock = os.getloadavg()[0], _Clock()
    path = train_sft(rows, build_tiny_qwen2(tok, "tiny"), out, cfg, tokenizer=tok, callbacks=[clock.as_callback()])
    from coa_lib.core import built_record
    done = built_record(path)
    (t0, n0), (t1, n1) = clock.marks[0], clock.marks[-1]
    return {"bf16": bf16, "load_avg_1min": load, "steps": done["global_step"], "tokens_seen": done["tokens_seen"],
            "wall_s_with_setup": done["wall_s"], "tokens_per_s": (n1 - n0) / (t1 - t0), "train_loss": done["train_loss"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20.0, help="timed seconds per fp32 measurement")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--compare-steps", type=int, default=30, help="steps of the fp32-vs-bf16 loss comparison")
    ap.add_argument("--run-dir", default=None, help="a run dir with the SFT sets (built at smoke size when missing)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    load_before = os.getloadavg()
    from coa_lib.stage_filter import build_sft_sets
    from coa_lib.stage_tasks import student_tokenizer
    rd = resolve_run_dir(a.run_dir)
    rows = build_sft_sets(rd, "smoke", progress=False)["coa_sft"]
    tok = student_tokenizer(rd, "smoke")
    train = tokenize_sft(rows, tok, a.seq)
    res = {"machine": platform.processor() or platform.machine(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "torch": torch.__version__, "threads": a.threads, "batch": a.batch, "seq": a.seq, "load_avg_before": load_before}
    res["peak_gflops"] = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
    print(f"load average {load_before[0]:.2f}; matmul peak fp32 {res['peak_gflops']['fp32']:.1f} GFLOP/s, bf16 {res['peak_gflops']['bf16']:.1f} GFLOP/s")
    fp32 = train_loop(tok, train, False, a.batch, a.seq, a.seconds)
    # bf16 first on one short row batch: where the CPU has no native bf16 GEMM a full batch takes minutes per step
    bf16_batch = a.batch if res["peak_gflops"]["bf16"] > res["peak_gflops"]["fp32"] / 4 else 1
    bf16 = train_loop(tok, train, True, bf16_batch, a.seq, a.seconds / 2)
    for r, peak in ((fp32, res["peak_gflops"]["fp32"]), (bf16, res["peak_gflops"]["bf16"])):
        r["mfu"] = r["tflops"] * 1e3 / peak
        r["batch"] = a.batch if r is fp32 else bf16_batch
        print(f"{'bf16' if r['bf16'] else 'fp32'} loop: {r['tokens_per_s']:,.0f} tokens/s ({r['steps']} steps of {r['batch']} x {a.seq}), "
              f"{r['tflops'] * 1e3:.2f} GFLOP/s = {r['mfu']:.0%} of its matmul peak")
        r.pop("losses")
    res["loop"] = {"fp32": fp32, "bf16": bf16}
    res["bf16_speedup"] = bf16["tokens_per_s"] / fp32["tokens_per_s"]
    # does bf16 still train as well? the same batches, the same steps (short rows when bf16 is slow)
    fast = res["bf16_speedup"] > 0.5
    k, cb, cs = (a.compare_steps, a.batch, a.seq) if fast else (4, 2, 128)
    same = {p: train_loop(tok, train, p == "bf16", cb, cs, 0, steps=k)["losses"] for p in ("fp32", "bf16")}
    res["loss_comparison"] = {"steps": k, "batch": cb, "seq": cs, "fp32": same["fp32"], "bf16": same["bf16"],
                              "max_abs_diff": max(abs(x - y) for x, y in zip(same["fp32"], same["bf16"]))}
    print(f"{k} steps of {cb} x {cs} on the same batches: loss fp32 {same['fp32'][-1]:.4f}, bf16 {same['bf16'][-1]:.4f}")
    with tempfile.TemporaryDirectory() as tmp:
        res["pipeline"] = {"fp32": pipeline(tok, rows, False, 10, Path(tmp) / "fp32")}
        if fast: res["pipeline"]["bf16"] = pipeline(tok, rows, True, 10, Path(tmp) / "bf16")
    for p, r in res["pipeline"].items(): print(f"train_sft {p}: {r['tokens_per_s']:,.0f} tokens/s over {r['steps']} steps")
    res["load_avg_after"] = os.getloadavg()
    res["faster"] = "bf16" if res["bf16_speedup"] > 1 else "fp32"
    res["note"] = ("bf16 autocast is only faster where the CPU multiplies bf16 natively (AVX512-BF16/AMX); "
                   f"this one reports {res['cpu_capability']} and a bf16 GEMM peak of {res['peak_gflops']['bf16']:.1f} GFLOP/s")
    print(f"bf16/fp32 speed: {res['bf16_speedup']:.2f}x -> use {res['faster']}; load average after {res['load_avg_after'][0]:.2f}")
    atomic_write_json(HERE / "results" / "train_bench.json", res)


if __name__ == "__main__":
    main()
