"""Throughput of coa_lib.tools: BM25 search and page reads on 10k-page corpora, sandboxed Python calls (1 and 2 workers).

Goals (issue): search >= 1,000 queries/s, sandbox >= 30 calls/s on 2 cores. Prints the figures and writes
bench/results/tools_bench.json. Run: .venv/bin/python bench/tools_bench.py [--quick]
"""
from __future__ import annotations
import argparse, os, platform, random, statistics, string, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from coa_lib.core import atomic_write_json
from coa_lib.sandbox import run_python, sandbox_info
from coa_lib.tools import CrawlTool, SearchTool

RESULTS = Path(__file__).resolve().parent / "results" / "tools_bench.json"
WORDS = ("amber harbour river glass bridge merchant mountain village founded born capital island tower library winter "
         "festival copper mill north south painter chemist novelist architect company film university population").split()


def world_corpus(n: int):
    "A coa_lib.tasks world with n entities (its pages), or None if the task module is not available."
    try:
        from coa_lib.worlds import make_world
    except ImportError:
        return None
    w = make_world(0, n_entities=n)
    return w.corpus, w.corpus_id


def synthetic_corpus(n: int, words_per_page: int = 120, seed: int = 0) -> list[dict]:
    "Random-word pages (about 800 characters each), each with one unique fact sentence."
    rng = random.Random(seed)
    pages = []
    for i in range(n):
        title = "".join(rng.choice(string.ascii_lowercase) for _ in range(8)).capitalize() + f" {i}"
        body = [" ".join(rng.choice(WORDS) for _ in range(12)) + "." for _ in range(words_per_page // 12)]
        body.insert(3, f"The secret code of {title} is zq{i}x.")
        pages.append({"title": title, "text": f"{title} is a {rng.choice(WORDS)}. " + " ".join(body)})
    return pages


def timed(fn, items) -> tuple[float, list]:
    t0 = time.perf_counter()
    out = [fn(x) for x in items]
    return time.perf_counter() - t0, out


def bench_search(name: str, corpus, corpus_id: str | None, queries: list[str], titles: list[str], cache: Path) -> dict:
    t0 = time.perf_counter(); s = SearchTool(corpus, k=5, cache_dir=cache, corpus_id=corpus_id); build_s = time.perf_counter() - t0
    t0 = time.perf_counter(); s2 = SearchTool(corpus, k=5, cache_dir=cache, corpus_id=corpus_id); load_s = time.perf_counter() - t0
    assert s2.loaded_from_cache
    s.search(queries[0])
    dt, obs = timed(s.search, queries)
    c = CrawlTool(corpus)
    dt_c, pages = timed(c.crawl, titles)
    misses = [t[::-1] for t in titles[:200]]                    # not a title: difflib suggestions (the slow path)
    dt_m, _ = timed(c.crawl, misses)
    return {"corpus": name, "pages": len(s.pages), "mean_page_chars": round(statistics.mean(len(t) for t in s.pages.texts)),
            "index_build_s": round(build_s, 3), "index_load_s": round(load_s, 3),
            "search_queries": len(queries), "search_qps": round(len(queries) / dt),
            "search_mean_obs_chars": round(statistics.mean(len(o) for o in obs)),
            "crawl_exact_per_s": round(len(titles) / dt_c), "crawl_miss_per_s": round(len(misses) / dt_m)}


def bench_sandbox(n: int) -> dict:
    info = sandbox_info()
    if not info.available: return {"available": False, "reason": info.reason}
    codes = [f"import math\nprint(sum(math.isqrt(i) for i in range({i})))" for i in range(n)]
    run_python("print(1)")
    lat = []
    def one(code):
        t0 = time.perf_counter(); r = run_python(code); lat.append(time.perf_counter() - t0)
        assert r.ok, r
    dt_seq, _ = timed(one, codes)
    seq_lat = sorted(lat)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(2) as ex: list(ex.map(one, codes))
    dt_par = time.perf_counter() - t0
    return {"available": True, "python": info.python, "calls": n, "seq_calls_per_s": round(n / dt_seq, 1),
            "two_workers_calls_per_s": round(n / dt_par, 1),
            "seq_latency_ms_p50": round(1000 * seq_lat[len(seq_lat) // 2], 1),
            "seq_latency_ms_p95": round(1000 * seq_lat[int(len(seq_lat) * 0.95)], 1)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller corpora and fewer calls (a smoke run of the bench)")
    args = ap.parse_args(argv)
    n_pages, n_q, n_calls = (1000, 500, 40) if args.quick else (10_000, 5000, 300)
    rng = random.Random(1)
    out = {"host": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_avg_at_start": os.getloadavg()},
           "goals": {"search_qps": 1000, "sandbox_calls_per_s": 30}, "search": []}
    with tempfile.TemporaryDirectory(prefix="coa-bench-") as cache:
        cache = Path(cache)
        w = world_corpus(n_pages)
        if w is not None:
            corpus, cid = w
            titles = list(corpus["title"])
            queries = [rng.choice([t, f"{t} founded", f"capital of {t}", f"who directed {t}", f"{t} population"])
                       for t in rng.choices(titles, k=n_q)]
            out["search"].append(bench_search(f"coa_lib.tasks world (make_world(0, n_entities={n_pages}))", corpus, cid,
                                              queries, rng.choices(titles, k=n_q), cache))
        syn = synthetic_corpus(n_pages)
        titles = [p["title"] for p in syn]
        queries = [rng.choice([f"secret code of {t}", " ".join(rng.sample(WORDS, 3)), t]) for t in rng.choices(titles, k=n_q)]
        out["search"].append(bench_search(f"synthetic random-word pages ({n_pages}, ~120 words each)", syn, None, queries,
                                          rng.choices(titles, k=n_q), cache))
    out["sandbox"] = bench_sandbox(n_calls)
    out["host"]["load_avg_at_end"] = os.getloadavg()
    for s in out["search"]:
        print(f"[search] {s['corpus']}: {s['pages']} pages, build {s['index_build_s']} s, load {s['index_load_s']} s, "
              f"{s['search_qps']} queries/s (obs ~{s['search_mean_obs_chars']} chars), crawl {s['crawl_exact_per_s']}/s exact, "
              f"{s['crawl_miss_per_s']}/s misses")
    sb = out["sandbox"]
    if sb.get("available"):
        print(f"[sandbox] {sb['seq_calls_per_s']} calls/s sequential (p50 {sb['seq_latency_ms_p50']} ms, "
              f"p95 {sb['seq_latency_ms_p95']} ms), {sb['two_workers_calls_per_s']} calls/s with 2 workers")
    else:
        print(f"[sandbox] unavailable: {sb['reason']}")
    print(f"load average start/end: {out['host']['load_avg_at_start']} / {out['host']['load_avg_at_end']}")
    if not args.quick:
        atomic_write_json(RESULTS, out)
        print(f"wrote {RESULTS}")
    return out


if __name__ == "__main__":
    main()
