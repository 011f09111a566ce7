"""kill -9 and resume: a two-stage pipeline built from the library's own artifact writers (task splits and a dataset via
`load_or_build`/`atomic_dir`, the teacher's resumable shards) is killed mid-artifact and mid-stage by SIGKILL on the
runner's process group, then re-run: it finishes, reuses every completed artifact, and everything in the run dir loads.
The teacher's stage notebook itself (nbs/05_teacher_mas.ipynb), killed in each of its two artifacts, reruns with no manual
step and leaves no temporary behind."""
import json, os, shutil, signal, subprocess, sys, time
from pathlib import Path

import nbformat
import pytest
from datasets import load_from_disk

from coa_lib.reproduce import marker_path
from procs import live_pids, stat_fields

REPO = Path(__file__).resolve().parents[1]

STAGE_A = '''
import os, time
from pathlib import Path
from datasets import Dataset, load_from_disk
from coa_lib.core import atomic_dir, load_or_build
from coa_lib.stage_tasks import build_task_splits
from coa_lib.tasks import TaskConfig
rd = Path(run_dir); slow = float(os.environ.get("COA_TEST_SLOW", "0"))
splits = build_task_splits(rd, TaskConfig.for_profile("smoke"))
def build(path):
    with open(rd / "builds.log", "a") as f: f.write("numbers\\n")
    def fill(tmp):
        Dataset.from_dict({"x": list(range(5000))}).save_to_disk(str(tmp))
        (rd / "numbers.building").touch(); time.sleep(slow)          # a kill lands here: the artifact is half-made
    atomic_dir(path, fill)
numbers = load_or_build(rd, "numbers", build, lambda p: load_from_disk(str(p)))
assert numbers.num_rows == 5000
'''

STAGE_B = '''
import os, time
from pathlib import Path
from coa_lib.core import load_or_build, save_dataset
from coa_lib.mas import run_teacher
from coa_lib.teacher import scripted_backend
from coa_lib.stage_tasks import build_task_splits
from coa_lib.tasks import TaskConfig
rd = Path(run_dir); slow = float(os.environ.get("COA_TEST_SLOW", "0"))
tasks = build_task_splits(rd, TaskConfig.for_profile("smoke"))["train"].select(range(12))
def build(path):
    ds = run_teacher(tasks, scripted_backend(tasks), run_dir=rd, name="traces", workers=1, shard_size=3, progress=False,
                     on_shard=lambda i: time.sleep(slow if i >= 1 else 0))     # kills land between shards
    save_dataset(ds, path)
traces = load_or_build(rd, "traces", build, lambda p: __import__("datasets").load_from_disk(str(p)))
assert traces.num_rows == 12
'''


def _nb(path: Path, source: str) -> Path:
    params = nbformat.v4.new_code_cell('profile = "smoke"\nrun_dir = None'); params.metadata["tags"] = ["parameters"]
    nb = nbformat.v4.new_notebook(cells=[params, nbformat.v4.new_code_cell(source)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "python3", "language": "python"}
    nbformat.write(nb, path); return path


def _start(nbs: Path, rd: Path, slow: float) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "coa_lib.reproduce", "--profile", "smoke", "--run-dir", str(rd), "--nbs-dir", str(nbs)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                            env={**os.environ, "COA_TEST_SLOW": str(slow), "OMP_NUM_THREADS": "1"})


def _kill_when(p: subprocess.Popen, ready, what: str, timeout: float = 240):
    "SIGKILL the runner's whole process group (runner, kernel, workers) as soon as `ready()` holds."
    try:
        deadline = time.time() + timeout
        while not ready():
            assert p.poll() is None, f"the run ended before {what}: {p.stderr.read().decode()[-1500:]}"
            assert time.time() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)
    finally:
        try: os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError: pass                                  # the run ended on its own: the assertion above says so
        p.wait(timeout=30)


def _alive_in_group(pgid: int) -> list[int]:
    return live_pids(lambda pid: (f := stat_fields(pid)) is not None and int(f[2]) == pgid)


def test_killed_mid_artifact_and_mid_stage_resumes_and_reuses(tmp_path):
    t0 = time.time()
    nbs = tmp_path / "nbs"; nbs.mkdir(); rd = tmp_path / "run"
    _nb(nbs / "00_a.ipynb", STAGE_A); _nb(nbs / "01_b.ipynb", STAGE_B)

    # 1. killed while `numbers` is half-written (inside atomic_dir): no marker, no half artifact under its name
    p = _start(nbs, rd, slow=60)
    _kill_when(p, lambda: (rd / "numbers.building").exists(), "the half-built artifact")
    assert not _alive_in_group(p.pid), "processes of the killed run are left"
    assert not (rd / "numbers.done").exists() and not (rd / "numbers").exists()
    assert (rd / "tasks_train.done").exists()                          # built before the kill
    tasks_mtime = (rd / "tasks_train").stat().st_mtime_ns
    (rd / "numbers.building").unlink()

    print(f"kill 1 at {time.time() - t0:.1f}s")
    # 2. killed in stage 01 after two teacher shards: stage 00 is reused, not re-run
    p = _start(nbs, rd, slow=60)
    shards = rd / "traces.shards"
    _kill_when(p, lambda: len(list(shards.glob("shard-*.jsonl"))) >= 2, "two teacher shards")
    assert marker_path(rd, Path("00_a.ipynb")).exists() and not marker_path(rd, Path("01_b.ipynb")).exists()
    done_shards = {s.name: s.stat().st_mtime_ns for s in shards.glob("shard-*.jsonl")}
    assert len(done_shards) >= 2 and not (rd / "traces.done").exists()

    print(f"kill 2 at {time.time() - t0:.1f}s")
    # 3. the re-run finishes, reusing every completed artifact
    p = _start(nbs, rd, slow=0)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err.decode()[-2000:]
    assert (rd / "builds.log").read_text().split() == ["numbers", "numbers"]     # once killed, once finished; never again
    assert (rd / "tasks_train").stat().st_mtime_ns == tasks_mtime                 # task splits reused
    for name, mtime in done_shards.items():                                       # finished shards were not recomputed
        assert not (shards / name).exists() or (shards / name).stat().st_mtime_ns == mtime
    assert load_from_disk(str(rd / "traces")).num_rows == 12

    print(f"finished at {time.time() - t0:.1f}s")
    # 4. everything in the run dir loads: every marked artifact, every JSON file; no half-written leftovers
    marked = [m.with_suffix("") for m in rd.glob("*.done") if m.is_file()]
    assert {m.name for m in marked} >= {"tasks_train", "tasks_dev", "tasks_test", "numbers", "traces"}
    for art in marked: assert load_from_disk(str(art)).num_rows > 0, art
    for j in rd.rglob("*.json"): json.loads(j.read_text())
    leftovers = [x.name for x in rd.rglob("*") if x.name.endswith(".tmp") or ".old-" in x.name]
    assert not leftovers, leftovers


def _entries(rd: Path) -> set[str]:
    "Every path under a run dir, relative; the executed notebook, its HTML, the run's report and summaries left out (they differ by time)."
    skip = {"notebooks", "html", "report.md", "summary.md", "summary.json", ".done"}
    return {p.relative_to(rd).as_posix() for p in rd.rglob("*") if p.relative_to(rd).parts[0] not in skip}


def test_teacher_notebook_killed_anywhere_reruns_and_leaves_no_temporary(tmp_path):
    """nbs/05_teacher_mas.ipynb at the smoke profile, SIGKILLed while it writes the training traces and, asked to make the
    dev and test traces again, while it writes those: each rerun completes with no manual step, leaves no temporary or demo
    folder in the run dir (the second leaves it exactly as the first did) and nothing in the temp dir, after the kill (the
    kernel's connection file included) or after the rerun."""
    tmp = tmp_path / "tmp"; tmp.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torch-cache")}
    def start(rd: Path, *extra: str) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "coa_lib.reproduce", "--profile", "smoke", "--run-dir", str(rd), "--only", "05", *extra]
        return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, env=env)
    def finish(rd: Path) -> None:
        p = start(rd); _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err.decode()[-3000:]
    rd, done = tmp_path / "run", None   # `done`: the run dir after the first rerun, which the second must leave as it found it
    def again(name: str) -> None:   # the artifact `name` removed, so that the rerun builds it (and can be killed in it) again
        shutil.rmtree(rd / name); (rd / f"{name}.done").unlink()
    kills = [((), lambda: (rd / "teacher_traces.shards").is_dir(), "the training traces", None),
             (("--force",), lambda: (rd / "teacher_eval.shards").is_dir(), "the dev and test traces", "teacher_eval")]
    def settled() -> set[str]:   # the temp dir once the killed processes' watchers have done their work
        deadline = time.time() + 30
        while any(p.is_dir() for p in tmp.iterdir()) and time.time() < deadline: time.sleep(0.1)
        return {p.name for p in tmp.iterdir()}
    for extra, ready, what, rebuild in kills:
        if rebuild: again(rebuild)
        _kill_when(start(rd, *extra), ready, what)
        killed_left = settled()   # the kernel's connection file too: it lives in the runner's watched temp dir
        assert not killed_left, sorted(killed_left)
        finish(rd)                                                                    # the rerun: no manual step
        assert not [p for p in rd.rglob("*") if p.name.startswith("tmp") or p.name.endswith(".tmp") or "demo" in p.name]
        left = sorted(_entries(rd) ^ (done or _entries(rd)))
        assert not left, f"after a kill at {what}, the rerun's run dir differs from a completed run's: {left[:10]}"
        done = _entries(rd)
        assert not settled(), sorted(settled())                                       # the rerun left nothing in the temp dir
