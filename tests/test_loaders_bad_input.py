"""Every benchmark loader, given a bad file, raises ONE error (`DataFormatError`) naming the file, the row and what is
wrong (never a bare KeyError / JSONDecodeError / UnicodeDecodeError, never a silent skip), and writes nothing.

Every format × every kind of bad file, through every entry point that reads that format: `load_benchmark`,
`load_corpus_file` and `corpus_for_task` (formats that carry a corpus), `load_benchmark(..., corpus=)` (a user corpus),
and the GameOf24 helpers that read AgentFlow's file (`excluded_game24_hands`, `game24_real`)."""
import csv, io, json
from pathlib import Path

import pytest

import coa_lib.core as C
import coa_lib.problems as P
import coa_lib.benchmarks as B
from coa_lib.benchmarks import load_benchmark, load_corpus_file
from coa_lib.core import DataFormatError
from coa_lib.tasks import corpus_for_task

SAMPLES = Path(__file__).resolve().parent.parent / "data" / "samples"
CSV_HEADER = ["Rank", "Puzzles", "AMT (s)", "Solved rate", "1-sigma Mean", "1-sigma STD"]
HANDS = [[1, 1, 4, 6], [2, 5, 7, 9], [3, 3, 8, 8]]


def _row(fmt: str, i: int):
    "A good row `i` of format `fmt`."
    if fmt in ("hotpotqa", "2wiki"):
        return {"_id": f"id{i}", "question": f"Where was P{i} born?", "answer": f"C{i}", "type": "bridge", "level": "easy",
                "context": [[f"P{i}", [f"P{i} was born in C{i}.", " P{i} writes."]], [f"C{i}", [f"C{i} is a city."]]],
                "supporting_facts": [[f"P{i}", 0]]}
    if fmt == "musique":
        return {"id": f"2hop__{i}", "question": f"q{i}?", "answer": f"a{i}", "answer_aliases": [],
                "paragraphs": [{"idx": 0, "title": f"T{i}", "paragraph_text": f"t{i}", "is_supporting": True}]}
    if fmt == "bamboogle": return {"pid": str(i), "question": f"Who is {i}?", "answer": [f"a{i}"]}
    if fmt == "gameof24_json": return {"pid": str(i), "question": HANDS[i], "answer": [], "query": "q"}
    if fmt == "aime_jsonl": return {"id": i, "problem": f"What is {i}+1?", "answer": str(i + 1)}
    if fmt == "agentflow_math": return {"pid": str(i), "question": f"What is {i}+1?", "answer": i + 1}
    if fmt == "corpus_jsonl": return {"title": f"T{i}", "text": f"text {i}"}
    if fmt == "gameof24_csv": return [str(i + 1), " ".join(map(str, HANDS[i])), "4.4", "99.20%", "4.67", "1.48"]
    raise KeyError(fmt)


FORMATS = {   # format: (layout, file name, the field a row cannot do without, (field, number), (field, list), (field, null))
    "hotpotqa": ("json", "hotpot.json", "answer", ("answer", 7), ("question", ["q"]), ("answer", None)),
    "2wiki": ("json", "2wiki.json", "answer", ("answer", 7.5), ("answer", ["x"]), ("question", None)),
    "musique": ("jsonl", "musique.jsonl", "answer", ("answer", 7), ("question", ["q"]), ("answer", None)),
    "bamboogle": ("json", "bamboogle.json", "answer", ("answer", 7), ("question", ["q"]), ("answer", None)),
    "gameof24_json": ("json", "gameof24.json", "question", ("answer", [24]), ("answer", [["2*5*(9-7)"]]), ("question", None)),
    "aime_jsonl": ("jsonl", "aime.jsonl", "answer", ("problem", 7), ("answer", ["14"]), ("answer", None)),
    "agentflow_math": ("json", "aime24.json", "answer", ("question", 7), ("answer", [3]), ("answer", None)),
    "corpus_jsonl": ("jsonl", "corpus.jsonl", "text", ("text", 7), ("title", ["T"]), ("text", None)),
    # CSV has no types: a number, a list literal and an empty field stand where the four numbers go
    "gameof24_csv": ("csv", "24.csv", "Puzzles", ("Puzzles", "24"), ("Puzzles", "[1, 2, 3, 4]"), ("Puzzles", "")),
}
assert set(FORMATS) == set(B.BENCHMARK_FORMATS), "a new format needs its bad files here"
KINDS = ("empty", "no_records", "truncated", "missing_field", "number_for_string", "list_for_string", "null",
         "not_a_record", "invalid_utf8", "pathological", "directory", "huge_integer", "lone_surrogate")
CORPUS_FORMATS = ("hotpotqa", "2wiki", "musique", "corpus_jsonl")


def _write(fmt: str, rows: list) -> str:
    "The file text: a JSON list with one row a line, JSONL, or CSV with its header."
    layout = FORMATS[fmt][0]
    if layout == "json": return "[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n]\n"
    if layout == "jsonl": return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    buf = io.StringIO(); w = csv.writer(buf, lineterminator="\n"); w.writerow(CSV_HEADER); w.writerows(rows)
    return buf.getvalue()


def _where(fmt: str) -> str:
    "How the message must name row 1 (the second record): index in a JSON list, line in JSONL / CSV (after the header)."
    return {"json": "row 1", "jsonl": "line 2", "csv": "line 3"}[FORMATS[fmt][0]]


def bad_file(fmt: str, kind: str, d: Path) -> tuple[Path, list[str]]:
    "Write a `kind` of bad file of format `fmt` under `d`: (its path, fragments its error message must hold)."
    layout, name, required, number, lst, null = FORMATS[fmt]
    p, rows, where = d / name, [_row(fmt, i) for i in range(3)], _where(fmt)
    csv_ = layout == "csv"

    def with_field(field, value):
        r = rows[1]
        if csv_: r[CSV_HEADER.index(field)] = value
        else: r[field] = value
        return _write(fmt, rows)

    if kind == "directory":
        p.mkdir(); return p, [name, "directory"]
    if kind == "empty": content, frags = b"", ["empty"]
    elif kind == "no_records":
        content = {"json": b"[]\n", "jsonl": b"\n\n", "csv": (",".join(CSV_HEADER) + "\n").encode()}[layout]
        frags = ["no records"]
    elif kind == "truncated":     # cut in the middle of row 1; the rows after it are lost
        text = _write(fmt, rows)
        line = text.split("\n")[1 if layout == "jsonl" else 2]
        cut = text.index(line) + (len(line) // 2 if not csv_ else line.index(" ") + 2)   # CSV: inside the four numbers
        content, frags = text[:cut].encode(), [where, "'Puzzles'" if csv_ else "malformed JSON"]
    elif kind == "missing_field":
        if csv_: rows[1] = rows[1][:1]        # a short row: no Puzzles column
        else: del rows[1][required]
        content, frags = _write(fmt, rows).encode(), [where, repr(required), "missing"]
    elif kind in ("number_for_string", "list_for_string"):
        field, value = number if kind == "number_for_string" else lst
        content, frags = with_field(field, value).encode(), [where, repr(field), "expected"]
    elif kind == "null":
        field, value = null
        content, frags = with_field(field, value).encode(), [where, repr(field), "empty" if csv_ else "null"]
    elif kind == "not_a_record":  # JSON: a string where a row object goes; CSV: a row with broken quoting
        text = _write(fmt, rows)
        if csv_:
            content, frags = text.replace("\n2,", '\n2,"1 2"x', 1).encode(), [where, "malformed CSV"]
        else:
            rows[1] = "just a string"
            content, frags = _write(fmt, rows).encode(), [where, "JSON object"]
    elif kind == "invalid_utf8":  # a Latin-1 byte inside row 1's text
        text = _write(fmt, rows)
        line = text.split("\n")[{"json": 2, "jsonl": 1, "csv": 2}[layout]]
        at = text.index(line) + len(line) // 2 if not csv_ else text.index(line) + line.index(",") + 1
        content = text[:at].encode() + b"caf\xe9 \xff" + text[at:].encode()
        frags = [where, "invalid UTF-8"]
    elif kind == "pathological":  # JSON nested 100,000 deep (a RecursionError inside json); CSV: a 200 kB field
        if csv_:
            content, frags = with_field("Puzzles", "1 " * 100_000).encode(), [where, "malformed CSV"]
        else:
            field = required
            text = with_field(field, None).replace("null", "[" * 100_000 + "]" * 100_000, 1)
            content, frags = text.encode(), [where, "nested too deeply"]
    elif kind == "huge_integer":  # 5,000 digits: past int()'s 4,300-digit limit (json.loads raised a bare ValueError)
        if csv_: content, frags = with_field("Puzzles", "1 2 3 " + "9" * 5000).encode(), [where, "'Puzzles'"]
        else:
            content = with_field(required, "@@").replace('"@@"', "9" * 5000).encode()
            frags = [where, "unreadable JSON value", "4300 digits"]
    elif kind == "lone_surrogate":  # JSON: a "\ud800" escape with no pair (a str that cannot be encoded); CSV: its bytes
        if csv_:
            text = with_field("Puzzles", "@@")
            content, frags = text.encode().replace(b"@@", b"1 2 3 \xed\xa0\x80"), [where, "invalid UTF-8"]
        else:
            content = with_field(required, "@@").replace('"@@"', '"caf\\ud800 x"').encode()
            frags = [where, repr(required), "lone surrogate"]
    else: raise KeyError(kind)
    p.write_bytes(content)
    return p, [name] + frags


def entry_points(fmt: str, p: Path, monkeypatch) -> dict:
    "Every public way this file gets read: name -> zero-argument call."
    calls = {"load_benchmark": lambda: load_benchmark(p, fmt)}
    if fmt in CORPUS_FORMATS:
        calls["load_corpus_file"] = lambda: load_corpus_file(p, fmt)
        meta = json.dumps({"corpus_id": f"unregistered-{p}", "corpus_source": {"path": str(p), "format": fmt}})
        calls["corpus_for_task"] = lambda: corpus_for_task({"id": "t", "meta": meta})
    if fmt == "corpus_jsonl":
        calls["load_benchmark(corpus=)"] = lambda: load_benchmark(SAMPLES / "bamboogle_sample.json", "bamboogle", corpus=p)
    if fmt == "gameof24_json":
        for mod in (C, P, B):   # problems and benchmarks import the name from core
            monkeypatch.setattr(mod, "agentflow_benchmark_dir", lambda repo_root=None: p.parent)

        def excluded():
            P.excluded_game24_hands.cache_clear()
            try: return P.excluded_game24_hands()
            finally: P.excluded_game24_hands.cache_clear()
        calls["excluded_game24_hands"] = excluded
        calls["game24_real"] = lambda: B.game24_real(2)
    return calls


def tree(root: Path) -> dict:
    "Every path under `root` with its size (directories as -1)."
    return {str(q.relative_to(root)): (-1 if q.is_dir() else q.stat().st_size) for q in sorted(root.rglob("*"))}


CASES = [(f, k) for f in FORMATS for k in KINDS]


def test_case_count():
    assert len(CASES) == len(FORMATS) * len(KINDS) == 9 * 13


@pytest.mark.parametrize("fmt,kind", CASES, ids=[f"{f}-{k}" for f, k in CASES])
def test_bad_file_raises_one_clear_error_and_writes_nothing(tmp_path, monkeypatch, fmt, kind):
    inputs, run_dir = tmp_path / "inputs", tmp_path / "run"
    inputs.mkdir(); run_dir.mkdir()
    (run_dir / "existing.json").write_text("{}")
    p, frags = bad_file(fmt, kind, inputs)
    monkeypatch.chdir(run_dir)                  # anything written to a relative path would land in the run dir
    before, corpora = tree(tmp_path), set(B._CORPORA)
    for name, call in entry_points(fmt, p, monkeypatch).items():
        with pytest.raises(DataFormatError) as err:
            call()
        msg = str(err.value)
        for frag in frags: assert frag in msg, (name, frag, msg)
        assert str(p) in msg, (name, msg)       # the full path, not just a name
        assert "\n" not in msg and len(msg) < 600, (name, msg)
        assert tree(tmp_path) == before, f"{name} left files behind"
        assert set(B._CORPORA) == corpora, f"{name} registered a corpus from a bad file"


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_the_good_version_of_each_file_loads(tmp_path, fmt):
    "The same rows, unbroken, load in full: the bad files above fail for their fault alone."
    p = tmp_path / FORMATS[fmt][1]
    p.write_text(_write(fmt, [_row(fmt, i) for i in range(3)]))
    ds = load_benchmark(p, fmt)
    assert len(ds) == 3


ODD = [   # (format, a bad value in row 1, fragments): values that crashed helpers inside the loaders
    ("gameof24_csv", ("Puzzles", "1 2 3 \u00b2"), ["line 3", "'Puzzles'", "four integers"]),     # '²'.isdigit() is True
    ("gameof24_csv", ("Puzzles", "1 2 3 " + "9" * 5000), ["line 3", "'Puzzles'", "four integers"]),
    ("gameof24_json", ("question", ["1", "2", "3", "\u0664"]), ["row 1", "'question'", "four integers"]),   # Arabic-Indic 4
    ("bamboogle", ("answer", "[{[1]: 2}]"), ["row 1", "'answer'", "list literal"]),   # literal_eval: TypeError
    ("bamboogle", ("answer", "[" * 5000 + "]" * 5000), ["row 1", "'answer'"]),
    ("aime_jsonl", ("answer", float("nan")), ["line 2", "'answer'", "finite"]),
    ("agentflow_math", ("answer", float("inf")), ["row 1", "'answer'", "finite"]),
    ("hotpotqa", ("supporting_facts", [["P1", "0"]]), ["row 1", "supporting_facts[0]"]),
    ("musique", ("paragraphs", [7]), ["line 2", "paragraphs[0]", "JSON object"]),
]


@pytest.mark.parametrize("fmt,field_value,frags", ODD, ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(ODD)])
def test_odd_values_are_named_not_crashes(tmp_path, fmt, field_value, frags):
    rows = [_row(fmt, i) for i in range(3)]
    field, value = field_value
    if FORMATS[fmt][0] == "csv": rows[1][CSV_HEADER.index(field)] = value
    else: rows[1][field] = value
    p = tmp_path / FORMATS[fmt][1]
    p.write_text(_write(fmt, rows))
    with pytest.raises(DataFormatError) as err:
        load_benchmark(p, fmt)
    for frag in [p.name] + frags: assert frag in str(err.value), (frag, str(err.value))


def test_friendly_files_still_load(tmp_path):
    "A UTF-8 BOM, CRLF line ends and a U+2028 inside a JSONL string (json.dumps writes it raw) are not faults."
    rows = [_row("aime_jsonl", i) for i in range(3)]
    rows[1]["problem"] = "line\u2028separator and \x0c form feed"
    p = tmp_path / "a.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in rows).encode())
    ds = load_benchmark(p, "aime_jsonl")
    assert len(ds) == 3 and ds[1]["question"] == rows[1]["problem"]
    c = tmp_path / "24.csv"
    c.write_bytes(b"\xef\xbb\xbf" + _write("gameof24_csv", [_row("gameof24_csv", i) for i in range(3)]).replace("\n", "\r\n").encode())
    ds = load_benchmark(c, "gameof24_csv")
    assert [json.loads(m)["hand"] for m in ds["meta"]] == HANDS and ds["id"] == ["game24-1", "game24-2", "game24-3"]
    j = tmp_path / "b.json"
    j.write_bytes(b"\xef\xbb\xbf" + _write("bamboogle", [_row("bamboogle", i) for i in range(3)]).encode())
    assert len(load_benchmark(j, "bamboogle")) == 3
