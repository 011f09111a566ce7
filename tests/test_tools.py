"Tests of coa_lib.tools: search/crawl over corpora (never raising on model text), index caching, the ToolBox contract, sandbox refusal."
import json, random, string, warnings
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from coa_lib import sandbox as S, tools as T
from coa_lib.format import ToolCall, find_tool_call
from coa_lib.sandbox import ExecResult, run_python, sandbox_info
from coa_lib.tools import ALREADY_CALLED, as_pages, CrawlTool, NO_CORPUS, Pages, SearchTool, tokenize, ToolBox

WORDS = ["amber", "harbour", "river", "glass", "bridge", "merchant", "mountain", "village", "founded", "born", "capital",
         "island", "tower", "library", "winter", "festival", "copper", "mill", "north", "south"]


def synthetic_corpus(n: int, seed: int = 0) -> list[dict]:
    "Pages with unique made-up titles; page i's 3rd sentence states a unique fact 'code word<i>'."
    rng = random.Random(seed)
    pages = []
    for i in range(n):
        title = "".join(rng.choice(string.ascii_lowercase) for _ in range(7)).capitalize() + f" {i}"
        sents = [f"{title} is a {rng.choice(WORDS)} {rng.choice(WORDS)}.",
                 " ".join(rng.choice(WORDS) for _ in range(12)) + ".",
                 f"The secret code of {title} is zq{i}x.",
                 " ".join(rng.choice(WORDS) for _ in range(10)) + "."]
        pages.append({"title": title, "text": " ".join(sents)})
    return pages


@pytest.fixture(scope="module")
def corpus():
    return synthetic_corpus(300)


@pytest.fixture(scope="module")
def search(corpus):
    return SearchTool(corpus, k=5)


# ---------------------------------------------------------------- pages

def test_as_pages_shapes_and_errors(corpus):
    from datasets import Dataset
    ds = Dataset.from_list(corpus)
    p1, p2 = as_pages(ds), as_pages(corpus)
    assert p1.titles == p2.titles and p1.corpus_id == p2.corpus_id
    assert as_pages(corpus, corpus_id="w-1").corpus_id == "w-1"
    with pytest.raises(ValueError, match="corpus row 1: field 'text'"):
        as_pages([{"title": "a", "text": "b"}, {"title": "c", "text": None}])
    with pytest.raises(ValueError, match="no \\['text'\\] column"):
        as_pages(Dataset.from_dict({"title": ["a"]}))


# ---------------------------------------------------------------- search

def test_unique_fact_is_found_and_shown_in_snippet(search, corpus):
    for i in (0, 17, 150, 299):
        obs = search.search(f"secret code of {corpus[i]['title']}")
        first = obs.splitlines()[0]
        assert first.startswith(f"1. {corpus[i]['title']}:") and f"zq{i}x" in first, obs


def test_search_results_are_compact(search):
    obs = search.search("amber harbour river glass bridge merchant")
    lines = obs.splitlines()
    assert len(lines) == 5 and all(len(l) < search.snippet_chars + 40 for l in lines)


def test_bad_queries_give_clear_observations(search):
    assert search.search("") == search.search("  \n\t ") == "Error: empty search query. Write a few keywords."
    assert search.search("!!! ??? ...").startswith("No results for")
    assert search.search("the of and").startswith("No results for")          # stopwords only
    long = search.search("qqq " * 10_000)
    assert long.startswith("No results for") and len(long) < 200


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=200), st.lists(st.sampled_from(WORDS + ["<web_search>", "\x00", "zq5x"]), max_size=30).map(" ".join)))
def test_search_never_raises(query):
    obs = _SEARCH.search(query)
    assert isinstance(obs, str) and obs


_SEARCH = SearchTool(synthetic_corpus(50, seed=1), k=3)


def test_k_larger_than_corpus_and_tiny_corpora():
    s = SearchTool([{"title": "Solo", "text": "Only one page here."}], k=10)
    assert s.search("solo page") == "1. Solo: Only one page here."
    s = SearchTool([{"title": "Empty", "text": ""}, {"title": "Other", "text": "words"}], k=3)
    assert s.search("empty").startswith("1. Empty:")


def test_degenerate_corpora():
    with pytest.raises(ValueError, match="empty corpus"):
        SearchTool([])
    s = SearchTool([{"title": "", "text": ""}, {"title": "?!", "text": "the of ..."}])
    assert s.search("anything").startswith("No results") and s.search("?!").startswith("No results")
    assert CrawlTool([]).crawl("x") == 'No such page: "x". Try <web_search> first.'


def test_odd_corpus_ids_stay_inside_the_cache_dir(tmp_path, corpus):
    SearchTool(corpus[:5], cache_dir=tmp_path / "idx", corpus_id="../../etc/evil id")
    assert [p.name for p in (tmp_path / "idx").iterdir()] == [".._.._etc_evil_id".lstrip(".")]
    assert not (tmp_path / "etc").exists()


def test_damaged_index_cache_is_rebuilt(tmp_path, corpus):
    SearchTool(corpus[:20], cache_dir=tmp_path, corpus_id="w")
    for f in (tmp_path / "w").glob("*.npy"): f.write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="unreadable"):
        s = SearchTool(corpus[:20], cache_dir=tmp_path, corpus_id="w")
    assert not s.loaded_from_cache and s.search(corpus[3]["title"]).startswith(f"1. {corpus[3]['title']}")
    assert SearchTool(corpus[:20], cache_dir=tmp_path, corpus_id="w").loaded_from_cache


def test_index_is_cached_on_disk_and_rebuilt_when_content_changes(tmp_path, corpus):
    s1 = SearchTool(corpus, cache_dir=tmp_path, corpus_id="world-x")
    assert not s1.loaded_from_cache and (tmp_path / "world-x" / "coa_meta.json").exists()
    s2 = SearchTool(corpus, cache_dir=tmp_path, corpus_id="world-x")
    assert s2.loaded_from_cache
    for q in ("secret code", "amber river", corpus[3]["title"]):
        assert s1.search(q) == s2.search(q)
    changed = corpus[:-1] + [{"title": "Brand New", "text": "A brand new page."}]
    s3 = SearchTool(changed, cache_dir=tmp_path, corpus_id="world-x")     # same id, other content: rebuilt, not reused
    assert not s3.loaded_from_cache and s3.search("brand new").startswith("1. Brand New")
    assert [p.name for p in tmp_path.iterdir()] == ["world-x"]            # atomic: no temp dirs left behind


# ---------------------------------------------------------------- crawl

def test_crawl_lookup_order_and_truncation(corpus):
    c = CrawlTool(corpus, max_chars=60)
    t = corpus[5]["title"]
    assert c.crawl(t).startswith(t + "\n")
    assert c.crawl(t.upper()).startswith(t + "\n")
    assert c.crawl(t[:-1] + "  " + t[-1]).startswith(t + "\n")                    # spacing
    typo = t[0] + t[2:]
    assert c.crawl(typo).startswith(f'{t} (closest match for "{typo}")')
    assert "[page truncated: showing 60 of" in c.crawl(t)
    miss = c.crawl("Completely Unrelated Title Xyz")
    assert miss.startswith('No such page: "Completely Unrelated Title Xyz".')


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_crawl_never_raises(title):
    obs = _CRAWL.crawl(title)
    assert isinstance(obs, str) and obs


_CRAWL = CrawlTool(synthetic_corpus(50, seed=2))


# ---------------------------------------------------------------- sandbox basics (hostile code: test_sandbox_hostile.py)

def test_run_python_basics():
    r = run_python("import json, sys\nprint(json.dumps({'a': [1, 2]}))\nprint('warn', file=sys.stderr)")
    assert r.ok and r.stdout == '{"a": [1, 2]}\n' and r.stderr == "warn\n" and r.error is None and r.isolated
    r = run_python("print('héllo ✓')")
    assert r.ok and r.stdout == "héllo ✓\n"
    r = run_python("def f():\n    raise ValueError('bad value')\nf()")
    assert not r.ok and r.error.endswith("ValueError: bad value") and "in f" in r.error
    assert run_python(None).error.startswith("TypeError")                      # not a string: an error, not an exception
    assert run_python("x = 1\n" * 100_000).error.startswith("ValueError: code too long")
    r = run_python("import sys\nprint(sys.flags.isolated, sys.flags.no_site, 'numpy' in sys.modules)")
    assert r.stdout == "1 1 False\n"                                             # -I -S: no site-packages imported


def test_snippet_runs_as_a_real_main_module():
    r = run_python("import pickle\nfrom multiprocessing import Pool\ndef sq(x): return x * x\n"
                   "class P: pass\nprint(len(pickle.dumps(P())) > 0, __name__, __file__)\n"
                   "with Pool(2) as p: print(p.map(sq, range(5)))", timeout_s=10)
    assert r.ok and r.stdout == "True __main__ main.py\n[0, 1, 4, 9, 16]\n", r


def test_run_python_concurrent_results_do_not_mix():
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(2) as ex:
        results = list(ex.map(lambda i: run_python(f"print({i} * {i})"), range(12)))
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(12)]


def test_refuses_without_isolation_unless_allowed(monkeypatch):
    monkeypatch.setattr(S, "_find_bwrap", lambda: None)
    try:
        info = sandbox_info(refresh=True)
        assert not info.available and "bubblewrap" in info.reason and "not installed" in info.reason
        r = run_python("print('should not run')")
        assert not r.ok and r.error.startswith("SandboxUnavailable: isolation is unavailable") and r.stdout == ""
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            r = run_python("import os\nprint(os.getcwd().startswith('/tmp/coa-unisolated-'))", allow_unisolated=True)
        assert r.ok and r.stdout == "True\n" and r.isolated is False and any("WITHOUT isolation" in str(x.message) for x in w)
        with pytest.warns(RuntimeWarning, match="WITHOUT isolation"):
            r = run_python("while True: pass", timeout_s=0.5, allow_unisolated=True)
        assert r.timed_out and not r.isolated
    finally:
        monkeypatch.undo()
        assert sandbox_info(refresh=True).available


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="the unreachable-interpreter case is the root one (bwrap runs as nobody)")
def test_a_failed_set_up_names_the_path_and_bwraps_message(monkeypatch, tmp_path):
    # an interpreter in a 0700 directory: bwrap (run as nobody) cannot bind it; the reason says so, not "install bubblewrap"
    private = tmp_path / "private"; (private / "bin").mkdir(parents=True); private.chmod(0o700)
    py = private / "bin" / "python3"; py.write_bytes(Path("/usr/bin/python3").read_bytes()); py.chmod(0o755)
    monkeypatch.setattr(S, "_python_candidates", lambda: [str(py)])
    try:
        info = sandbox_info(refresh=True)
        assert not info.available, info
        assert str(private) in info.reason and "bwrap:" in info.reason and "Permission denied" in info.reason, info.reason
        assert f"uid {S.SANDBOX_UID}" in info.reason and "install" not in info.reason.lower(), info.reason
        r = run_python("print(1)")
        assert not r.ok and str(private) in r.error and "install" not in r.error.lower(), r.error
    finally:
        monkeypatch.undo()
        assert sandbox_info(refresh=True).available


def test_exec_result_observation():
    assert ExecResult(False, "x" * 5000, "", "Boom").observation(100).endswith("characters]\nBoom")


# ---------------------------------------------------------------- ToolBox

@pytest.fixture
def box(corpus):
    return ToolBox(corpus, k=3)


def test_toolbox_dispatch_and_cache_hits(box, corpus):
    t = corpus[7]["title"]
    text = f"<think>look it up</think><web_search>secret code of {t}</web_search>"
    obs = box(find_tool_call(text))
    assert "zq7x" in obs
    assert box(ToolCall("web_search", f"  SECRET code   of {t} ")) == ALREADY_CALLED
    assert box(ToolCall("web_search", f"{t}: the secret code?")) == ALREADY_CALLED   # same words, same observation
    assert box(ToolCall("crawl_page", t)).startswith(t)
    assert box(ToolCall("crawl_page", t.lower())) == ALREADY_CALLED
    assert box(ToolCall("crawl_page", "https://wiki.example/" + t.replace(" ", "_"))) == ALREADY_CALLED
    assert box(ToolCall("code", "print(6 * 7)")) == "42"
    assert box(ToolCall("code", "print(6 * 7)  ")) == ALREADY_CALLED
    assert box(ToolCall("code", "print(6*7)")) == "42"                         # different code: executed again
    assert box.stats.as_dict() == {"calls": {"web_search": 1, "crawl_page": 1, "code": 2},
                                   "cache_hits": {"web_search": 2, "crawl_page": 2, "code": 1}, "errors": {}, "misses": {},
                                   "seconds": box.stats.as_dict()["seconds"]}


def test_toolbox_errors_never_raise(box):
    assert box(ToolCall("python", "print(1)")).startswith("Error: unknown tool 'python'")
    assert box(None).startswith("Error: unknown tool 'None'")
    assert box("not a call").startswith("Error: unknown tool")
    assert box(ToolCall("code", "   ")) == "Error: empty <code> call."
    assert box(ToolCall("crawl_page", "No Such Page At All 123")).startswith("No such page")
    assert box(ToolCall("code", "1/0")).endswith("ZeroDivisionError: division by zero")
    assert box.stats.errors["python"] == 1 and box.stats.errors["code"] == 2 and box.stats.misses["crawl_page"] == 1


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["web_search", "crawl_page", "bogus", "", "observation"]), st.text(max_size=100))
def test_toolbox_never_raises(name, arg):
    assert isinstance(_BOX(ToolCall(name, arg)), str)


_BOX = ToolBox(synthetic_corpus(30, seed=3))


def test_toolbox_code_timeout_is_configurable():
    box = ToolBox(python_timeout_s=0.5)
    assert box(ToolCall("code", "while True: pass")) == "TimeoutError: code ran longer than 0.5 s and was stopped"
    assert box.last_exec.timed_out and box.stats.errors["code"] == 1


def test_toolbox_without_corpus_and_fresh(box):
    nb = ToolBox()
    assert nb(ToolCall("web_search", "x")) == NO_CORPUS and nb(ToolCall("crawl_page", "x")) == NO_CORPUS
    assert nb(ToolCall("code", "print('hi')")) == "hi"
    box(ToolCall("web_search", "amber"))
    ep = box.fresh()
    assert ep.search_tool is box.search_tool and ep.crawl_tool is box.crawl_tool
    assert ep(ToolCall("web_search", "amber")) != ALREADY_CALLED and box(ToolCall("web_search", "amber")) == ALREADY_CALLED
    assert ep.stats.calls["web_search"] == 1 and box.stats.cache_hits["web_search"] == 1


def test_tool_exception_becomes_an_error_observation(box, monkeypatch):
    def broken(q): raise RuntimeError("index exploded")
    monkeypatch.setitem(box.handlers, "web_search", broken)
    assert box(ToolCall("web_search", "amber")) == "Error: web_search failed: RuntimeError: index exploded"


# ---------------------------------------------------------------- for_task and the per-corpus LRU

@pytest.fixture
def fake_tasks(monkeypatch):
    "A stand-in for `corpus_for_task` (as the tools module sees it) that counts its calls."
    calls = []
    worlds = {f"w{i}": synthetic_corpus(20, seed=10 + i) for i in range(3)}
    def corpus_for_task(task):
        calls.append(task["id"])
        meta = json.loads(task["meta"])
        return worlds.get(meta.get("world"))
    monkeypatch.setattr(T, "corpus_for_task", corpus_for_task)
    monkeypatch.setattr(T, "_TOOL_LRU", type(T._TOOL_LRU)())
    return calls, worlds


def test_for_task_builds_each_index_once(fake_tasks, monkeypatch):
    calls, worlds = fake_tasks
    builds = []
    real_build = SearchTool._build
    monkeypatch.setattr(SearchTool, "_build", lambda self: builds.append(1) or real_build(self))
    tasks = [{"id": str(i), "kind": "multihop", "meta": json.dumps({"world": f"w{i % 3}", "corpus_id": f"w{i % 3}"})}
             for i in range(60)]
    boxes = [ToolBox.for_task(t) for t in tasks]
    assert len(builds) == 3 and len(calls) == 3                 # corpus id in meta: later tasks never rebuild the corpus
    assert boxes[0].search_tool is boxes[3].search_tool and boxes[0].search_tool is not boxes[1].search_tool
    assert boxes[0].seen is not boxes[3].seen
    t = worlds["w1"][4]["title"]
    assert boxes[1](ToolCall("crawl_page", t)).startswith(t)
    # without a corpus id the corpus is fetched each time, but identical content maps to one index
    anon = [ToolBox.for_task({"id": f"a{i}", "kind": "multihop", "meta": json.dumps({"world": "w2"})}) for i in range(5)]
    assert len(builds) == 4 and len({id(b.search_tool) for b in anon}) == 1


def test_for_task_without_corpus_is_code_only(fake_tasks):
    box = ToolBox.for_task({"id": "m1", "kind": "math", "meta": "{}"})
    assert not box.has_corpus and box(ToolCall("web_search", "x")) == NO_CORPUS and box(ToolCall("code", "print(2+2)")) == "4"
    assert T._task_corpus_id({"meta": "not json"}) is None and T._task_corpus_id({"meta": {"corpus_id": "w9"}}) == "w9"
    assert T._task_corpus_id({"meta": json.dumps({"corpus_id": 3})}) == "3" and T._task_corpus_id({}) is None


def test_for_task_on_real_worlds_reads_every_fact():
    tasks_mod = pytest.importorskip("coa_lib.tasks")
    if not hasattr(tasks_mod, "make_world"): pytest.skip("coa_lib.tasks has no make_world yet")
    n_steps = 0
    for seed in (0, 1):
        world = tasks_mod.make_world(seed)
        for kind in ("multihop", "comparison"):
            for task in tasks_mod.make_tasks(world, kind, 5, "train", seed):
                box = ToolBox.for_task(task)
                for step in json.loads(task["meta"]).get("path", []):
                    if step.get("tool") == "web_search":
                        n_steps += 1
                        assert step["fact"] in box(ToolCall("web_search", step["query"])), step
    assert n_steps > 10
