"""Load on coa_lib.serve: N concurrent official `openai` clients against the server with a tiny random Qwen2.

The server runs as its own process (`python -m coa_lib.serve`, as it is deployed), the clients are threads here, each its
own `openai.OpenAI` (max_retries=0, so a failure is counted, not retried away); all start together on a barrier and send
their requests back to back, cycling completions / chat completions / completions with n=2. One client alone first gives
the unloaded latency. The server generates one request at a time (one model, one lock), so under load the latency is
mostly the queue: about clients x service time.

    python bench/serve_load.py [--clients 50] [--requests 3] [--max-tokens 8] [--size nano] [--threads 1]
Prints p50 / p95 / max latency, requests/s and failures; writes bench/results/serve_load.json.
"""
from __future__ import annotations
import argparse, os, platform, socket, statistics, subprocess, sys, tempfile, threading, time
from collections import Counter
from pathlib import Path

import openai
import torch

from coa_lib.core import atomic_write_json
from coa_lib.llm import build_tiny_qwen2, n_params
from coa_lib.tokenizer import build_tokenizer

HERE = Path(__file__).resolve().parent
TEXT = ("<think>Find the director.</think>\n<web_search>director of Blue Harbor</web_search>\n"
        "<answer>Ana Vell</answer> Ana Vell (born 1961) is a film director from Orsk.")
MODEL_ID = "tiny-coa"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_dir: Path, threads: int = 1, port: int | None = None, model_id: str = MODEL_ID) -> tuple[subprocess.Popen, str]:
    "The server as a subprocess (on `port`, default a free one); returns it and its base URL once /v1/models answers."
    port = port or free_port()
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=str(HERE.parent))
    proc = subprocess.Popen([sys.executable, "-m", "coa_lib.serve", "--model", str(model_dir), "--port", str(port),
                             "--model-id", model_id, "--quiet"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/v1"
    oc = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=10)
    deadline = time.time() + 120
    while True:
        try:
            oc.models.list()
            return proc, url
        except openai.APIConnectionError:
            if proc.poll() is not None: raise RuntimeError(f"server exited: {proc.stdout.read()}")
            if time.time() > deadline: proc.kill(); raise RuntimeError("server did not come up in 120 s")
            time.sleep(0.3)


def one_request(c: openai.OpenAI, i: int, j: int, max_tokens: int) -> tuple[int, int]:
    "Request j of client i; returns (choices, completion tokens) after checking the answer is well-formed."
    prompt = f"Client {i} question {j}: who directed Blue Harbor?"
    kind = j % 3
    if kind == 1:
        r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
                                      temperature=0)
        texts = [ch.message.content for ch in r.choices]
    else:
        r = c.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=max_tokens, temperature=0, n=2 if kind == 2 else 1)
        texts = [ch.text for ch in r.choices]
    n = 2 if kind == 2 else 1
    u = r.usage
    ok = (len(r.choices) == n and all(isinstance(t, str) for t in texts) and r.model == MODEL_ID
          and all(ch.finish_reason in ("stop", "length") for ch in r.choices)
          and u.total_tokens == u.prompt_tokens + u.completion_tokens and u.completion_tokens <= n * max_tokens)
    if not ok: raise ValueError(f"malformed response: {r}")
    return n, u.completion_tokens


def run_clients(url: str, clients: int, requests: int, max_tokens: int) -> dict:
    lat, errors, tokens, choices = [], [], [0], [0]
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)

    def client(i):
        c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=300)
        barrier.wait()
        for j in range(requests):
            t0 = time.perf_counter()
            try:
                n, ct = one_request(c, i, j, max_tokens)
                with lock: lat.append(time.perf_counter() - t0); tokens[0] += ct; choices[0] += n
            except Exception as e:  # counted as a failure
                with lock: errors.append(f"{type(e).__name__}: {str(e)[:200]}")

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads: t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads: t.join()
    wall = time.perf_counter() - t0
    q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) >= 2 else [lat[0] if lat else float("nan")] * 99
    return {"clients": clients, "requests_per_client": requests, "requests": clients * requests, "ok": len(lat),
            "failures": len(errors), "failure_kinds": dict(Counter(e.split(":")[0] for e in errors)),
            "failure_examples": errors[:5], "wall_s": wall, "requests_per_s": len(lat) / wall,
            "completion_tokens_per_s": tokens[0] / wall, "choices": choices[0],
            "latency_s": {"p50": q[49], "p95": q[94], "max": max(lat) if lat else None,
                          "mean": statistics.fmean(lat) if lat else None, "min": min(lat) if lat else None}}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--requests", type=int, default=3, help="requests per client, back to back")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--size", default="nano", help="Qwen2 size of the random model (nano ~1M params, as in tests)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the server (OMP_NUM_THREADS)")
    ap.add_argument("--baseline", type=int, default=20, help="requests from one client alone first (0: none)")
    ap.add_argument("--out", default=str(HERE / "results" / "serve_load.json"))
    a = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="coa-serve-load-"))
    tok = build_tokenizer([TEXT] * 30, vocab_size=400)
    model = build_tiny_qwen2(tok, a.size, init_std=0.2)
    model.save_pretrained(work); tok.save_pretrained(work)
    load0 = os.getloadavg()
    proc, url = start_server(work, a.threads)
    try:
        base = run_clients(url, 1, a.baseline, a.max_tokens) if a.baseline else None
        load = run_clients(url, a.clients, a.requests, a.max_tokens)
        alive = proc.poll() is None
    finally:
        proc.terminate()
        try: proc.wait(10)
        except subprocess.TimeoutExpired: proc.kill(); proc.wait()
    res = {"model": {"size": a.size, "params": n_params(model), "vocab": len(tok)},
           "setup": {"max_tokens": a.max_tokens, "greedy": True, "mix": "completions / chat / completions n=2",
                     "server": "python -m coa_lib.serve (own process)", "server_torch_threads": a.threads,
                     "client_retries": 0, "cpus": os.cpu_count(), "loadavg_before": load0, "loadavg_after": os.getloadavg(),
                     "note": "loadavg includes any other job on the machine (a training run shared these cores)",
                     "python": platform.python_version(), "torch": torch.__version__, "openai": openai.__version__},
           "single_client": base, "load": load, "server_alive_after": alive}
    lt = load["latency_s"]
    if base:
        print(f"1 client  x {a.baseline:3d}: p50 {base['latency_s']['p50'] * 1e3:7.1f} ms  "
              f"{base['requests_per_s']:6.1f} req/s  failures {base['failures']}")
    print(f"{a.clients} clients x {a.requests}: p50 {lt['p50']:.2f} s  p95 {lt['p95']:.2f} s  max {lt['max']:.2f} s  "
          f"{load['requests_per_s']:.1f} req/s  {load['completion_tokens_per_s']:.0f} completion tok/s  "
          f"failures {load['failures']}/{load['requests']}  (load {load0[0]:.1f} on {os.cpu_count()} cpus)")
    atomic_write_json(a.out, res)
    return res


if __name__ == "__main__":
    main()
