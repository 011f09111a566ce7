"""The teacher MAS against an OpenAI-compatible endpoint with N concurrent requests, and an endpoint crash mid-run.

`run_teacher(tasks, OpenAIBackend(url), workers=N)` solves N tasks at a time, so N requests are in flight. Measured:

1. against `coa_lib.serve` (its own process, a random nano Qwen2 with the run's student tokenizer; it generates one
   request at a time under a lock, like any single-model reference server): tasks/s at concurrency 1, 4, 16;
2. the client side alone: the scripted teacher behind a fixed per-request latency (what an endpoint that serves requests
   concurrently, e.g. vLLM with continuous batching, looks like to the client): tasks/s at the same concurrencies;
3. a crash: the server is SIGKILLed after the run's second shard; the run stops with a BackendError, the finished shards
   are on disk and load, the server is restarted on the same port, and the re-run computes only the missing shards.

    python bench/teacher_concurrency.py [--tasks 48] [--concurrency 1 4 16] [--latency-ms 100]
Writes bench/results/teacher_concurrency.json.
"""
from __future__ import annotations
import argparse, json, os, platform, signal, tempfile, time
from pathlib import Path

from coa_lib.core import atomic_write_json
from coa_lib.llm import Backend, BackendError, OpenAIBackend, build_tiny_qwen2
from coa_lib.mas import MASLimits, run_teacher
from coa_lib.stage_tasks import build_task_splits, student_tokenizer
from coa_lib.tasks import TaskConfig
from coa_lib.teacher import scripted_backend
from serve_load import free_port, start_server   # bench/ is on the path when a bench script runs

HERE = Path(__file__).resolve().parent
MODEL_ID = "tiny-teacher"
LIMITS = MASLimits(token_scale=0.25)    # a random model writes to its budget: keep each call short


class LatencyBackend(Backend):
    "A backend that waits `latency_s` per request, then answers with `inner` (requests from different threads overlap)."
    def __init__(self, inner: Backend, latency_s: float): self.inner, self.latency_s = inner, latency_s
    def generate(self, prompts, stop=None, max_new_tokens=256, temperature=0.0, seed=None):
        time.sleep(self.latency_s)
        return self.inner.generate(prompts, stop=stop, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)


def timed(tasks, backend, tok, run_dir: Path, name: str, workers: int) -> dict:
    "One run_teacher over `tasks` with `workers` in flight: tasks/s, requests/s and what the traces say."
    t0 = time.perf_counter()
    ds = run_teacher(tasks, backend, tok, limits=LIMITS, run_dir=run_dir, name=name, workers=workers, shard_size=8, progress=False)
    wall = time.perf_counter() - t0
    calls = sum(ds["n_calls"])
    return {"concurrency": workers, "tasks": ds.num_rows, "wall_s": round(wall, 2), "tasks_per_s": round(ds.num_rows / wall, 3),
            "requests": calls, "requests_per_s": round(calls / wall, 2), "accuracy": round(sum(r >= 1.0 for r in ds["reward"]) / ds.num_rows, 3)}


def crash_and_resume(tasks, tok, model_dir: Path, run_dir: Path, workers: int) -> dict:
    "Kill the server after the second shard, restart it on the same port, re-run: what was lost and what was redone."
    port = free_port()
    server, url = start_server(model_dir, port=port, model_id=MODEL_ID)
    backend = OpenAIBackend(url, MODEL_ID, max_retries=2, backoff_s=0.2, timeout=30)
    done: list[int] = []
    def kill_after_two(i: int) -> None:
        done.append(i)
        if len(done) == 2: server.send_signal(signal.SIGKILL); server.wait()
    error = None
    try: run_teacher(tasks, backend, tok, limits=LIMITS, run_dir=run_dir, name="crash", workers=workers, shard_size=8,
                     progress=False, on_shard=kill_after_two)
    except BackendError as e: error = f"{type(e).__name__}: {str(e)[:160]}"
    shards = sorted((run_dir / "crash.shards").glob("*.jsonl"))
    rows_on_disk = [json.loads(line) for p in shards for line in p.read_text().splitlines()]
    server, _ = start_server(model_dir, port=port, model_id=MODEL_ID)
    redone: list[int] = []
    try: ds = run_teacher(tasks, backend, tok, limits=LIMITS, run_dir=run_dir, name="crash", workers=workers, shard_size=8,
                          progress=False, on_shard=redone.append)
    finally: server.send_signal(signal.SIGTERM); server.wait(timeout=30)
    n_shards = -(-len(tasks) // 8)
    return {"shards": n_shards, "shards_before_the_crash": len(done), "error_raised": error,
            "shard_files_after_the_crash": len(shards), "rows_in_them": len(rows_on_disk),
            "shards_redone_after_restart": len(redone), "rows_after_resume": ds.num_rows,
            "all_task_ids_once": sorted(ds["id"]) == sorted(t["id"] for t in tasks),
            "rows_kept_unchanged": ds.to_list()[:len(rows_on_disk)] == rows_on_disk if rows_on_disk else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=48)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--latency-ms", type=float, default=100.0)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="teacher-conc-"))
    splits = build_task_splits(work, TaskConfig.for_profile("smoke"))
    train = splits["train"].shuffle(seed=0)
    tasks = [dict(t) for t in train.select(range(min(a.tasks, train.num_rows)))]
    tok = student_tokenizer(work, "smoke")
    model_dir = work / "model"
    build_tiny_qwen2(tok, "nano", seed=0).save_pretrained(str(model_dir)); tok.save_pretrained(str(model_dir))
    out = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg_start": os.getloadavg()},
           "tasks": len(tasks), "limits": {"token_scale": LIMITS.token_scale, "max_rounds": LIMITS.max_rounds}}
    server, url = start_server(model_dir, model_id=MODEL_ID)
    try:
        backend = OpenAIBackend(url, MODEL_ID, timeout=120)
        out["coa_lib_serve"] = [timed(tasks, backend, tok, work, f"serve_c{c}", c) for c in a.concurrency]
    finally: server.send_signal(signal.SIGTERM); server.wait(timeout=30)
    for r in out["coa_lib_serve"]: print("coa_lib.serve        ", r)
    lat = LatencyBackend(scripted_backend(tasks), a.latency_ms / 1000)
    out["concurrent_endpoint"] = {"latency_ms": a.latency_ms,
                                  "runs": [timed(tasks, lat, tok, work, f"lat_c{c}", c) for c in a.concurrency]}
    for r in out["concurrent_endpoint"]["runs"]: print(f"latency {a.latency_ms:.0f} ms endpoint", r)
    out["crash"] = crash_and_resume(tasks, tok, model_dir, work / "crash_run", workers=4)
    print("crash:", out["crash"])
    out["machine"]["load_avg_end"] = os.getloadavg()
    atomic_write_json(HERE / "results" / "teacher_concurrency.json", out)


if __name__ == "__main__":
    main()
