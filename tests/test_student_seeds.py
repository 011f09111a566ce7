"bench/student_seeds.py trains the other seeds from the stage's own base: it must not pretrain (and overwrite) `sft/base` per seed."
import importlib.util
from pathlib import Path

from coa_lib.core import done_marker, read_json

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
