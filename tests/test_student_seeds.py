"bench/student_seeds.py trains the other seeds from the stage's own base: it must not pretrain (and overwrite) `sft/base` per seed."
import importlib.util
from pathlib import Path

from coa_lib.core import done_marker, mark_built, read_json, training_record

BENCH = Path(__file__).resolve().parent.parent / "bench" / "student_seeds.py"


def _bench():
    spec = importlib.util.spec_from_file_location("student_seeds", BENCH)
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod


def test_seeds_share_the_stage_base_and_leave_it_alone(tmp_path):
    bench = _bench()
    trained = bench.seed_students(tmp_path, "smoke", [0, 1])
    base = tmp_path / "sft" / "base"
    stamp, record = done_marker(base).stat().st_mtime_ns, read_json(done_marker(base))
    assert set(trained) == {0, 1} and set(trained[1]) == set(bench.COMPARED)
    assert all(p.parent == tmp_path / "seeds" / "seed1" for p in trained[1].values())
    again = bench.seed_students(tmp_path, "smoke", [0, 1, 2])               # another seed later: found, trained, base untouched
    assert done_marker(base).stat().st_mtime_ns == stamp and read_json(done_marker(base)) == record
    assert again[1] == trained[1] and set(again[2]) == set(bench.COMPARED)
    assert not (tmp_path / "seeds" / "seed1" / "base").exists()


def test_a_retrained_student_is_evaluated_anew_and_the_report_drops_a_stale_file(tmp_path):
    bench = _bench()
    from coa_lib.report import seeds_file_problem, seeds_record
    trained = bench.seed_students(tmp_path, "smoke", [0, 1])
    metrics = lambda s: tmp_path / "seeds" / "seed1" / "eval" / f"{s}_test" / "metrics.json"
    first = bench.evaluations(tmp_path, "smoke", 1, trained[1])
    stamps = {s: metrics(s).stat().st_mtime_ns for s in bench.COMPARED}
    assert bench.evaluations(tmp_path, "smoke", 1, trained[1]) == first                  # found again: nothing re-run
    assert {s: metrics(s).stat().st_mtime_ns for s in bench.COMPARED} == stamps
    record = seeds_record(tmp_path, trained)                                                # what the bench writes as "trained"
    assert record["0"]["coa"]["path"] == "sft/coa" and seeds_file_problem(tmp_path, {"trained": record}) is None
    coa1 = trained[1]["coa"]                                                               # seed 1's CoA student "retrained": another record
    mark_built(coa1, {**training_record(coa1), "steps": -1})
    bench.evaluations(tmp_path, "smoke", 1, trained[1])
    assert metrics("coa").stat().st_mtime_ns != stamps["coa"]                            # its old evaluation is not reused
    assert metrics("react").stat().st_mtime_ns == stamps["react"]
    coa0 = trained[0]["coa"]                                         # the run's own CoA student trained again to the same weights (another run, another record)
    mark_built(coa0, {**training_record(coa0), "steps": -1})
    assert record["0"]["coa"]["weights"] and seeds_file_problem(tmp_path, {"trained": record}) is None   # still the students the file measured
    weights = next(Path(coa0).glob("*.safetensors")); data = weights.read_bytes()
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))          # retrained to other weights: the file is stale
    assert "(coa retrained since)" in seeds_file_problem(tmp_path, {"trained": record})


def test_summarize_gives_each_kind_per_seed_and_pairs_task_by_task():
    bench = _bench()
    kind_of = {f"t{i}": "code" if i < 4 else "math" for i in range(8)}
    solve = lambda ids: {t: float(t in ids) for t in kind_of}
    react = solve({"t0", "t4", "t5"})
    per_seed = {0: {"coa": solve({"t0", "t1", "t4", "t5"}), "coa_unfiltered": react, "react": react},
                1: {"coa": solve({"t4", "t5", "t6"}), "coa_unfiltered": react, "react": react}}   # seed 1: code collapses
    s = bench.summarize(per_seed, kind_of)
    coa = s["students"]["coa"]
    assert coa["accuracy_by_seed"] == [0.5, 0.375] and coa["by_kind"] == {"code": [0.5, 0.0], "math": [0.5, 0.75]}
    assert s["per_seed_differences"]["coa-react"] == [0.125, 0.0]
    c = s["comparisons"]["coa-react"]                        # per-task mean over seeds: t1 +0.5, t6 +0.5, t0 -0.5
    assert (c["n"], c["wins"], c["losses"]) == (8, 2, 1) and abs(c["diff"] - 0.0625) < 1e-12


def test_make_readme_adopts_a_seeds_file_of_another_run_with_the_same_weights(tmp_path):
    from coa_lib.core import atomic_write_json
    from coa_lib.report import SEEDS_FILE, adopt_seeds_files, seeds_record
    runs = {name: tmp_path / name for name in ("first", "again")}
    for i, rd in enumerate(runs.values()):                                    # two runs of the same code: same weights, other records
        for s in bench_students():
            (rd / "sft" / s).mkdir(parents=True); (rd / "sft" / s / "model.safetensors").write_bytes(s.encode())
            mark_built(rd / "sft" / s, {"student": s, "train_s": 10 + i})
    measured = {"seeds": [0, 1], "trained": seeds_record(runs["first"], {0: {s: runs["first"] / "sft" / s for s in bench_students()}})}
    atomic_write_json(tmp_path / "results" / SEEDS_FILE, measured)
    lines = adopt_seeds_files(runs["again"], tmp_path / "results")
    assert lines == [f"{SEEDS_FILE}: adopted from {tmp_path / 'results'} (it measured this run's students: the same weights)"]
    assert read_json(runs["again"] / SEEDS_FILE) == measured
    (runs["first"] / "sft" / "react" / "model.safetensors").write_bytes(b"other")   # a run whose react differs
    (runs["first"] / SEEDS_FILE).unlink(missing_ok=True)
    assert "not used" in adopt_seeds_files(runs["first"], tmp_path / "results")[0] and not (runs["first"] / SEEDS_FILE).exists()


def bench_students() -> tuple[str, ...]:
    return _bench().COMPARED
