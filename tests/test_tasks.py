"Tests of coa_lib.tasks: determinism, split discipline, decontamination, gold paths, code tasks and file loaders."
import hashlib, io, itertools, json, os, re, subprocess, sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

import coa_lib.core as C
import coa_lib.worlds as W
import coa_lib.problems as P
import coa_lib.benchmarks as B
import coa_lib.tasks as T
from coa_lib.rewards import check_24
from coa_lib.benchmarks import load_benchmark
from coa_lib.core import DataFormatError, QA_KINDS, SPLITS, TASK_COLUMNS, TASK_KINDS
from coa_lib.problems import CODE_FAMILIES
from coa_lib.tasks import corpus_for_task, make_task_suite, make_tasks, safe_arith
from coa_lib.worlds import COMMON_WORDS, make_world

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "data" / "samples"
SHARED_AGENTFLOW = REPO.parent / "shared" / "data" / "benchmarks" / "agentflow"
SAMPLE_FILES = {"hotpotqa": "hotpotqa_sample.json", "2wiki": "2wiki_sample.json", "musique": "musique_sample.jsonl",
                "bamboogle": "bamboogle_sample.json", "gameof24_csv": "gameof24_sample.csv", "gameof24_json": "gameof24_sample.json",
                "aime_jsonl": "aime_sample.jsonl", "agentflow_math": "agentflow_math_sample.json", "corpus_jsonl": "corpus_sample.jsonl"}


def ds_bytes(ds) -> bytes:
    buf = io.BytesIO(); ds.to_json(buf); return buf.getvalue()


def metas(ds): return [json.loads(m) for m in ds["meta"]]


@pytest.fixture(scope="module")
def world(): return make_world(11, n_entities=40)


@pytest.fixture(scope="module")
def big_world(): return make_world(5, n_entities=150)


# ---------------------------------------------------------------- determinism

def test_same_seed_same_bytes(world):
    assert make_world(11, 40).pages == world.pages
    for kind in TASK_KINDS:
        w = world if kind in QA_KINDS else None
        a, b = make_tasks(w, kind, 6, "all" if w else "train", seed=3), make_tasks(w, kind, 6, "all" if w else "train", seed=3)
        assert ds_bytes(a) == ds_bytes(b), kind
        assert ds_bytes(a) != ds_bytes(make_tasks(w, kind, 6, "all" if w else "train", seed=4)), kind
    s1 = make_task_suite(TASK_KINDS, 5, "dev", seed=1, worlds_per_split=3)
    assert ds_bytes(s1) == ds_bytes(make_task_suite(TASK_KINDS, 5, "dev", seed=1, worlds_per_split=3))
    assert make_world(12, 40).pages != world.pages


def test_independent_of_hash_seed():
    "Byte-identical suites under different PYTHONHASHSEED (no set/dict-order dependence on string hashing)."
    code = ("import io, hashlib, coa_lib.core as C, coa_lib.tasks as T; b = io.BytesIO(); "
            "T.make_task_suite(C.TASK_KINDS, 4, 'test', seed=2, worlds_per_split=3).to_json(b); "
            "print(hashlib.sha256(b.getvalue()).hexdigest())")
    digests = set()
    for hs in ("1", "987"):
        env = {**os.environ, "PYTHONHASHSEED": hs}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
        assert out.returncode == 0, out.stderr[-2000:]
        digests.add(out.stdout.strip().splitlines()[-1])
    assert len(digests) == 1


def test_columns_and_kinds(world):
    for kind in TASK_KINDS:
        ds = make_tasks(world if kind in QA_KINDS else None, kind, 4, "all" if kind in QA_KINDS else "dev", seed=0)
        assert ds.column_names == list(TASK_COLUMNS) and set(ds["kind"]) == {kind}
        assert len(set(ds["id"])) == len(ds)
        for m in metas(ds): assert isinstance(m, dict)


def test_errors_are_clear(world):
    with pytest.raises(ValueError, match="unknown task kind"): make_tasks(world, "trivia", 1)
    with pytest.raises(ValueError, match="unknown split"): make_tasks(world, "multihop", 1, "validation")
    with pytest.raises(ValueError, match="need a World"): make_tasks(None, "comparison", 1)
    with pytest.raises(ValueError, match="distinct mixed questions"): make_tasks(world, "mixed", 100_000, "test")
    with pytest.raises(ValueError, match="too small"): make_world(0, n_entities=5)


# ---------------------------------------------------------------- names

def _question_words():
    texts = [r.question + " " + (r.np or "") for r in T.RELATIONS] + [c.question for c in T.COMPARISONS] + list(T.START_NP.values())
    w = make_world(3, 60)
    for tpl in T.MIXED_TEMPLATES:
        ents = w.of_type(tpl.subjects[0])
        for names in ([(e.name,) for e in ents] if len(tpl.subjects) == 1 else itertools.combinations([e.name for e in ents], 2)):
            built = tpl.build(w, names, C.rng_for(0))
            if built:
                q = built[0]
                for n in names: q = q.replace(n, " ")
                texts.append(q)
                break
    return {x.lower() for t in texts for x in re.findall(r"[A-Za-z]+", t)} - {"x", "a", "b"}


def test_names_do_not_collide():
    fixed = {w.lower() for w in W.COMPANY_SUFFIXES + W.FILM_NOUNS} | {"university", "of", "institute", "college"}
    qwords = _question_words()
    assert {"what", "which", "who", "year", "born"} <= qwords
    for seed in range(30):
        w = make_world(seed, 40)
        names = list(w.entities)
        assert len({n.lower() for n in names}) == len(names) == 40
        owner: dict[str, str] = {}
        for e in w.entities.values():
            for word in e.name.split():
                lw = word.lower()
                if lw in fixed: continue
                assert lw not in COMMON_WORDS and lw not in qwords, (seed, e.name)
                assert word.isalpha() and len(word) >= 4, e.name
                if lw in owner:   # a generated word is shared only between deliberate namesakes
                    assert w.entities[owner[lw]].get("namesake") == e.name, (seed, owner[lw], e.name)
                owner[lw] = e.name


# ---------------------------------------------------------------- gold paths

def _check_gold_path(w, row):
    m = json.loads(row["meta"])
    searches = [s for s in m["path"] if s["tool"] == "web_search"]
    assert searches
    for s in searches:   # every fact is on its page, and the page is found by searching its title
        assert s["page"] in w.pages and s["fact"] in w.pages[s["page"]] and s["query"] == s["page"]
        # and says what it reads there: the page's entity type and the relation whose sentence is the fact (the plan's sub-question)
        assert s["type"] == w.entities[s["page"]].type and w.sentences[(s["page"], s["relation"])] == s["fact"]
    for e in m["entities"]: assert e in row["question"]
    if row["kind"] == "multihop":
        assert m["hops"] == len(searches) and 1 <= m["hops"] <= 3
        assert row["answer"] in searches[-1]["fact"]
        for a, b in zip(searches, searches[1:]): assert b["page"] in a["fact"]     # each bridge entity is read off the previous page
        assert searches[0]["page"] == m["entities"][0]
    elif row["kind"] == "comparison":
        assert row["answer"] in m["entities"] and m["hops"] == len(searches) in (2, 4)
        assert row["answer"] in w.pages
    elif row["kind"] == "mixed":
        code = m["path"][-1]
        assert code["tool"] == "code" and code["result"] == row["answer"]
        expr = re.fullmatch(r"print\((.*)\)", code["code"]).group(1)
        assert str(safe_arith(expr)) == row["answer"]
        facts = " ".join(s["fact"] for s in searches)
        for num in re.findall(r"\d+", expr):   # every operand was looked up, or given in the question
            assert num in facts or num in row["question"], (num, expr)
        for i, step in enumerate(searches):   # a page is named by the question or read off an earlier fact
            assert step["page"] in m["entities"] or any(step["page"] in s["fact"] for s in searches[:i]), step


def test_answers_lie_on_the_gold_path():
    for seed in range(6):
        w = make_world(100 + seed, 40)
        for kind in QA_KINDS:
            for row in make_tasks(w, kind, 15, "all", seed=seed):
                _check_gold_path(w, row)


def test_suite_rows_rebuild_their_corpus():
    suite = make_task_suite(QA_KINDS, 10, "test", seed=4, worlds_per_split=4, n_entities=30)
    for row in suite:
        m = json.loads(row["meta"])
        assert m["corpus_id"] == f"world-{m['world_seed']}-{m['n_entities']}"
        corpus = corpus_for_task(row)
        w = make_world(m["world_seed"], m["n_entities"])
        assert list(corpus["title"]) == list(w.pages)
        _check_gold_path(w, row)
    assert corpus_for_task(suite[0]) is corpus_for_task(suite[0])
    for kind in ("math", "game24", "code"):
        assert corpus_for_task(make_tasks(None, kind, 1, "train")[0]) is None


def test_distractors_present(world):
    text = " ".join(world.pages.values())
    assert "appeared in the film" in text and "competes with" in text and "often compared with" in text


# ---------------------------------------------------------------- splits

def test_entity_disjoint_within_a_world(big_world):
    for kind in QA_KINDS:
        named = {}
        for split in ("train", "dev", "test"):
            ds = make_tasks(big_world, kind, 30 if split == "train" else 5, split, seed=0)
            named[split] = {e for m in metas(ds) for e in m["entities"]}
            assert all(C.split_of((big_world.seed, e)) == split for e in named[split])
        for a, b in itertools.combinations(named, 2): assert not named[a] & named[b], (kind, a, b)


def test_suite_worlds_and_entities():
    kw = dict(kinds=QA_KINDS, n_per_kind=20, seed=0, worlds_per_split=5, n_entities=30)
    suites = {s: make_task_suite(split=s, **kw) for s in SPLITS}
    seeds = {s: {m["world_seed"] for m in metas(d)} for s, d in suites.items()}
    assert {x % 3 for x in seeds["train"] | seeds["train_heldout"]} == {0}
    assert {x % 3 for x in seeds["dev"]} == {1} and {x % 3 for x in seeds["test"]} == {2}
    assert not seeds["test"] & seeds["train"] and not seeds["dev"] & seeds["train"] and not seeds["dev"] & seeds["test"]
    assert seeds["train_heldout"] <= {T.world_seed_for("train", 0, i) for i in range(5)}
    ents = {s: {(m["world_seed"], e) for m in metas(d) for e in m["entities"]} for s, d in suites.items()}
    assert not ents["train"] & ents["train_heldout"]
    assert len(seeds["train"]) == 5   # round-robin: every world contributes


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**5), st.integers(0, 10**5))
def test_world_seed_ranges_never_meet(seed_a, seed_b, i, j):
    tr = T.world_seed_for("train", seed_a, i)
    assert tr != T.world_seed_for("dev", seed_b, j) and tr != T.world_seed_for("test", seed_b, j)
    assert T.world_split_of(T.world_seed_for("test", seed_b, j)) == "test"


def test_problem_kinds_disjoint_across_splits():
    keys = {}
    for split in SPLITS:
        ds = make_tasks(None, "math", 40, split, seed=1)
        keys[("math", split)] = {m["problem_key"] for m in metas(ds)}
        ds = make_tasks(None, "code", 30, split, seed=1)
        keys[("code", split)] = {m["problem_key"] for m in metas(ds)}
        ds = make_tasks(None, "game24", 60, split, seed=1)
        keys[("game24", split)] = {tuple(sorted(m["hand"])) for m in metas(ds)}
    for kind in ("math", "code", "game24"):
        for a, b in itertools.combinations(SPLITS, 2): assert not keys[(kind, a)] & keys[(kind, b)], (kind, a, b)
    # different seeds of one split stay inside that split's problems
    assert {m["problem_key"] for m in metas(make_tasks(None, "code", 30, "test", seed=9))} <= {
        C.stable_hash(["code", f.name, v]) for f, v in P.code_problems("test")}


# ---------------------------------------------------------------- game of 24

def _agentflow_hands(path):
    return {tuple(sorted(r["question"])) for r in json.loads(Path(path).read_text())}


def test_solvable_hands_exact():
    hands = P.solvable_hands()
    assert len(hands) == 1362 and len(set(hands)) == 1362
    assert (1, 1, 1, 1) not in hands and (3, 3, 8, 8) in hands and (1, 1, 4, 6) in hands
    for h in hands[::37]:
        assert check_24(P.solve24(h), h)


def test_agentflow_hands_excluded_from_train_and_dev():
    repo_copy = REPO / "data" / "benchmarks" / "agentflow" / "gameof24.json"
    real = _agentflow_hands(repo_copy)
    assert len(real) == 300
    if SHARED_AGENTFLOW.exists():
        assert repo_copy.read_bytes() == (SHARED_AGENTFLOW / "gameof24.json").read_bytes()
    for split in SPLITS:   # train and dev required; train_heldout and test excluded too (documented)
        assert not set(P.game24_hands(split)) & real, split
        ds = make_tasks(None, "game24", 1500 if split == "train" else 200, split, seed=5)
        got = {tuple(sorted(m["hand"])) for m in metas(ds)}
        assert not got & real, split
    suite = make_task_suite(("game24",), 300, "dev", seed=2, worlds_per_split=1)
    assert not {tuple(sorted(m["hand"])) for m in metas(suite)} & real


def test_game24_answers_are_valid():
    for row in make_tasks(None, "game24", 50, "test", seed=0):
        hand = json.loads(row["meta"])["hand"]
        assert check_24(row["answer"], hand)
        assert all(str(x) in row["question"] for x in hand)


# ---------------------------------------------------------------- code and math

def test_code_reference_solutions_pass_their_tests():
    assert len(CODE_FAMILIES) >= 15
    families = set()
    for split in SPLITS:
        ds = make_tasks(None, "code", len(P.code_problems(split)), split, seed=0)
        for row in ds:
            m = json.loads(row["meta"])
            families.add(m["family"])
            assert m["entry_point"] in row["question"] and len(m["tests"]) >= 3
            ns: dict = {}
            exec(m["reference"], ns)
            for t in m["tests"]: exec(t, ns)    # the reference passes its hidden tests
            stub: dict = {}
            exec(f"def {m['entry_point']}(*args):\n    return None\n", stub)
            failures = 0
            for t in m["tests"]:
                try: exec(t, stub)
                except AssertionError: failures += 1
            assert failures, (m["family"], "tests cannot fail")
    assert families == {f.name for f in CODE_FAMILIES}


def test_math_answers_are_computed_numbers():
    for row in make_tasks(None, "math", 40, "train", seed=3):
        m = json.loads(row["meta"])
        assert re.fullmatch(r"-?\d+", row["answer"]) and m["path"][0]["result"] == row["answer"]
        nums = re.findall(r"\d+", row["question"])
        assert any(len(n) >= 3 for n in nums)   # multi-digit arithmetic: worth the code tool


# ---------------------------------------------------------------- loaders

@pytest.mark.parametrize("fmt", list(SAMPLE_FILES))
def test_every_sample_loads(fmt):
    ds = load_benchmark(SAMPLES / SAMPLE_FILES[fmt], fmt)
    assert len(ds) >= 2
    if fmt == "corpus_jsonl":
        assert ds.column_names == ["title", "text"]; return
    assert ds.column_names == list(TASK_COLUMNS) and set(ds["kind"]) <= set(TASK_KINDS)
    expected = {"hotpotqa": {"multihop", "comparison"}, "2wiki": {"multihop", "comparison"}, "musique": {"multihop"},
                "bamboogle": {"multihop"}, "gameof24_csv": {"game24"}, "gameof24_json": {"game24"}, "aime_jsonl": {"math"},
                "agentflow_math": {"math"}}[fmt]
    assert set(ds["kind"]) == expected
    if fmt in ("hotpotqa", "2wiki", "musique"):
        assert corpus_for_task(ds[0]) is ds.corpus and len(ds.corpus) >= 3
        for row in ds:    # the gold facts are in the corpus
            texts = dict(zip(ds.corpus["title"], ds.corpus["text"]))
            for s in json.loads(row["meta"])["path"]: assert s["fact"] in texts[s["page"]]
    if fmt.startswith("gameof24"):
        for row in ds: assert check_24(row["answer"], json.loads(row["meta"])["hand"])


def test_benchmark_corpus_rebuilds_in_a_fresh_process_state():
    ds = load_benchmark(SAMPLES / "musique_sample.jsonl", "musique")
    row = ds[1]
    B._CORPORA.clear()                       # as in another process: found again from corpus_source
    assert list(corpus_for_task(row)["title"]) == list(ds.corpus["title"])


def test_bamboogle_with_user_corpus():
    ds = load_benchmark(SAMPLES / "bamboogle_sample.json", "bamboogle", corpus=SAMPLES / "corpus_sample.jsonl")
    assert corpus_for_task(ds[0]) is ds.corpus and "Taskeron" in ds.corpus["title"]
    assert "When ready" not in ds[0]["question"] and "When ready" in json.loads(ds[0]["meta"])["raw_question"]
    B._CORPORA.clear()
    assert list(corpus_for_task(ds[0])["title"]) == list(ds.corpus["title"])
    assert corpus_for_task(load_benchmark(SAMPLES / "bamboogle_sample.json", "bamboogle")[0]) is None


def test_real_agentflow_files_load():
    d = C.agentflow_benchmark_dir()
    g = load_benchmark(d / "gameof24.json", "gameof24_json")
    assert len(g) == 300 and set(g["kind"]) == {"game24"}
    for row in g:
        m = json.loads(row["meta"])
        assert check_24(row["answer"], m["hand"]) and "×" not in row["answer"]
    for name, n in (("aime24.json", 30), ("amc23.json", 40)):
        ds = load_benchmark(d / name, "agentflow_math")
        assert len(ds) == n and set(ds["kind"]) == {"math"}
        assert all(re.fullmatch(r"-?\d+", a) for a in ds["answer"]) and not any("When ready" in q for q in ds["question"])
    raw = json.loads((d / "bamboogle.json").read_text())
    b = load_benchmark(d / "bamboogle.json", "bamboogle")
    assert len(b) == 125 and set(b["kind"]) == {"multihop"} and b["answer"][0] == raw[0]["answer"][0]
    assert corpus_for_task(b[0]) is None
    assert C.agentflow_benchmark_dir(REPO) == REPO / "data" / "benchmarks" / "agentflow"


def test_agentflow_dir_fallback_and_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="AgentFlow benchmark files not found"):
        C.agentflow_benchmark_dir(tmp_path / "repo")
    shared = tmp_path / "shared" / "data" / "benchmarks" / "agentflow"
    shared.mkdir(parents=True)
    (shared / "gameof24.json").write_text("[]")
    assert C.agentflow_benchmark_dir(tmp_path / "repo") == shared      # ../shared next to a repo without its copy


def _jl(*recs): return "".join(json.dumps(r) + "\n" for r in recs)


GOOD_HOTPOT = {"_id": "a", "question": "q", "answer": "x", "context": [["T", ["s."]]], "supporting_facts": [["T", 0]], "type": "bridge", "level": "easy"}
GOOD_MUSIQUE = {"id": "2hop__1", "question": "q", "answer": "a", "answer_aliases": [], "paragraphs": [{"idx": 0, "title": "T", "paragraph_text": "t", "is_supporting": True}]}
MALFORMED = [   # (format, file name, content, expected fragments of the message)
    ("hotpotqa", "h.json", json.dumps([GOOD_HOTPOT, {**GOOD_HOTPOT, "answer": None}]), ["h.json", "row 1", "'answer'"]),
    ("hotpotqa", "h2.json", json.dumps([GOOD_HOTPOT, {**GOOD_HOTPOT, "context": [["T", "not a list"]]}]), ["h2.json", "row 1", "context[0]"]),
    ("2wiki", "w.json", json.dumps([{k: v for k, v in GOOD_HOTPOT.items() if k != "question"}]), ["w.json", "row 0", "'question'"]),
    ("musique", "m.jsonl", _jl(GOOD_MUSIQUE, {**GOOD_MUSIQUE, "paragraphs": [{"idx": 0, "title": "T"}]}), ["m.jsonl", "line 2", "paragraphs[0]", "'paragraph_text'"]),
    ("musique", "m2.jsonl", _jl(GOOD_MUSIQUE) + "{not json\n", ["m2.jsonl", "line 2", "malformed JSON"]),
    ("bamboogle", "b.json", json.dumps([{"pid": "0", "question": "q", "answer": ["a"]}, {"pid": "1", "question": "q", "answer": 7}]), ["b.json", "row 1", "'answer'"]),
    ("gameof24_csv", "g.csv", "Rank,Puzzles,AMT (s),Solved rate,1-sigma Mean,1-sigma STD\n1,1 1 4 6,4,99%,4,1\n2,1 1 x 6,4,99%,4,1\n", ["g.csv", "line 3", "'Puzzles'"]),
    ("gameof24_csv", "g2.csv", "Rank,Hand\n1,1 2 3 4\n", ["g2.csv", "line 1", "'Puzzles'"]),
    ("gameof24_json", "g.json", json.dumps([{"pid": "0", "question": [1, 2, 3], "answer": ["x"]}]), ["g.json", "row 0", "'question'"]),
    ("gameof24_json", "g3.json", json.dumps([{"pid": "0", "question": [1, 2, 3, 44], "answer": ["x"]}]), ["g3.json", "row 0", "'question'", "1-13"]),
    ("aime_jsonl", "a.jsonl", _jl({"problem": "p", "answer": 1}, {"question": "p", "answer": 2}), ["a.jsonl", "line 2", "'problem'"]),
    ("agentflow_math", "am.json", json.dumps([{"pid": "0", "question": "q", "answer": 1}, {"pid": "1", "question": ["q"], "answer": 1}]), ["am.json", "row 1", "'question'", "expected str"]),
    ("agentflow_math", "am2.json", json.dumps({"not": "a list"}), ["am2.json", "JSON list"]),
    ("corpus_jsonl", "c.jsonl", _jl({"title": "a", "text": "b"}, {"title": "c"}), ["c.jsonl", "line 2", "'text'"]),
    ("corpus_jsonl", "c2.jsonl", _jl({"title": "a", "text": "b"}, ["x"]), ["c2.jsonl", "line 2", "JSON object"]),
]


@pytest.mark.parametrize("fmt,name,content,fragments", MALFORMED, ids=[m[1] for m in MALFORMED])
def test_malformed_files_name_file_row_field(tmp_path, fmt, name, content, fragments):
    p = tmp_path / name
    p.write_text(content)
    with pytest.raises(DataFormatError) as err:
        load_benchmark(p, fmt)
    for frag in fragments: assert frag in str(err.value), (frag, str(err.value))


def test_unknown_format_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="unknown benchmark format"): load_benchmark(SAMPLES / "aime_sample.jsonl", "aime2030")
    with pytest.raises(FileNotFoundError, match="no such benchmark file"): load_benchmark(tmp_path / "none.json", "hotpotqa")


# ---------------------------------------------------------------- the stage

def test_build_task_splits_finds_its_artifacts(tmp_path):
    cfg = T.TaskConfig(n_train=4, n_eval=2, n_heldout=2, worlds_train=2, worlds_eval=2, n_entities=30)
    from coa_lib.stage_tasks import build_task_splits, plot_task_stats
    first = build_task_splits(tmp_path, cfg)
    assert {s: len(d) for s, d in first.items()} == {"train": 24, "train_heldout": 12, "dev": 12, "test": 12}
    again = build_task_splits(tmp_path, cfg)
    assert ds_bytes(again["test"]) == ds_bytes(first["test"])
    assert (plot_task_stats(first, tmp_path / "f.png")).stat().st_size > 1000


def test_task_difficulty_is_the_teacher_plan_length():
    "`tasks.task_difficulty` (a property of the task) agrees with the scripted teacher's plan: hard at 3 steps or more."
    from coa_lib.core import task_meta
    from coa_lib.tasks import plan_length, task_difficulty
    from coa_lib.teacher import plan_steps
    suite = make_task_suite(TASK_KINDS, 12, "dev", seed=3, worlds_per_split=3)
    for t in suite:
        assert plan_length(t) == len(plan_steps({**t, "_meta": task_meta(t)})), t["id"]
    assert {task_difficulty(t) for t in suite} == {"easy", "hard"}
