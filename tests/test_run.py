"""One `Run` built once, and the artifact table keyed by name and config hash (issue 26): a changed task-split setting
rebuilds the splits and everything made from them, an unchanged config rebuilds nothing, and a run dir of an earlier
version (markers without a hash) still loads. Trained models follow the same rule."""
from dataclasses import replace
from pathlib import Path

from coa_lib.core import atomic_write_json, built_record, done_marker, read_json
from coa_lib.run import Run, task_key
from coa_lib.stages import PREPARED
from coa_lib.stage_tasks import build_task_splits
from coa_lib.stage_teacher import teacher_eval
from coa_lib.stage_filter import build_sft_sets
from coa_lib.stage_sft import student_named, train_student
from coa_lib.tasks import TaskConfig

SMALL = TaskConfig(kinds=("multihop", "math"), n_train=2, n_eval=1, n_heldout=1, worlds_train=2, worlds_eval=1, n_entities=20)


def _markers(rd: Path) -> dict[str, tuple[str, int]]:
    "Each prepared artifact's config hash and marker mtime (ns): what tells a rebuild from a find."
    return {n: (read_json(rd / f"{n}.done")["config_hash"], (rd / f"{n}.done").stat().st_mtime_ns) for n in PREPARED}


def _prepare(run: Run) -> None:
    build_sft_sets(run, progress=False); teacher_eval(run, progress=False)


def test_a_changed_task_config_rebuilds_the_splits(tmp_path):
    "The planted stale artifact: splits built under one TaskConfig are not returned for another (main returned them)."
    build_task_splits(tmp_path / "run", SMALL)
    changed = replace(SMALL, n_train=3, seed=1)
    got = build_task_splits(tmp_path / "run", changed)["train"]
    assert got["id"] == build_task_splits(tmp_path / "fresh", changed)["train"]["id"], "stale task splits reused under a changed TaskConfig"


def test_a_changed_task_setting_rebuilds_everything_downstream(tmp_path):
    "Change a task-split setting: splits, tokenizer, teacher traces, distilled and SFT sets all rebuild; change nothing: nothing does."
    run = Run(tmp_path / "run", "smoke", tasks=SMALL)
    _prepare(run)
    first = _markers(run.dir)
    assert set(first) == set(PREPARED) and all(h == run.key(n) for n, (h, _) in first.items())
    train_ids = set(build_task_splits(run.dir, SMALL)["train"]["id"])
    assert set(teacher_eval(run, progress=False)["kind"]) <= set(SMALL.kinds)              # the custom TaskConfig reached the teacher
    _prepare(Run(tmp_path / "run", "smoke", tasks=SMALL))                                  # the same config, a new Run: nothing rebuilds
    assert _markers(run.dir) == first
    moved = Run(tmp_path / "run", "smoke", tasks=replace(SMALL, seed=1))
    _prepare(moved)
    second = _markers(run.dir)
    assert all(second[n][0] != first[n][0] and second[n][1] > first[n][1] for n in PREPARED), \
        [n for n in PREPARED if second[n][0] == first[n][0]]
    assert set(build_task_splits(run.dir, moved.tasks)["train"]["id"]) != train_ids


def test_a_filter_change_rebuilds_only_the_sft_sets(tmp_path):
    "What a change does not touch stays: a filter setting rebuilds the SFT sets, not the teacher's traces."
    run = Run(tmp_path / "run", "smoke", tasks=SMALL)
    _prepare(run)
    first = _markers(run.dir)
    _prepare(replace(run, filter=replace(run.filter, cap_per_task=1)))
    second = _markers(run.dir)
    changed = {n for n in PREPARED if second[n] != first[n]}
    assert changed == {"coa_sft", "react_sft", "direct_sft", "coa_sft_unfiltered"}, changed


def test_markers_of_an_earlier_version_still_load(tmp_path, capsys):
    "A run dir written before config hashes (markers without one) is taken as built, with a one-line notice, and adopted: a later change rebuilds."
    run = Run(tmp_path / "run", "smoke", tasks=SMALL)
    ids = build_task_splits(run.dir, SMALL)["train"]["id"]
    for s in ("train", "train_heldout", "dev", "test"): (run.dir / f"tasks_{s}.done").write_text("{}\n")   # as main wrote them
    other = replace(SMALL, seed=5)
    assert build_task_splits(run.dir, other)["train"]["id"] == ids                     # loaded, not rebuilt
    assert "built before config hashes" in capsys.readouterr().err
    assert read_json(run.dir / "tasks_train.done")["config_hash"] == task_key(other)    # adopted under the config it was loaded for
    assert build_task_splits(run.dir, SMALL)["train"]["id"] == ids                     # now a change of config rebuilds (back to SMALL)
    assert read_json(run.dir / "tasks_train.done")["config_hash"] == task_key(SMALL)


def _trained(path: Path) -> tuple[str, int]:
    "A trained model's config hash and marker mtime (ns)."
    return built_record(path)["config_hash"], done_marker(path).stat().st_mtime_ns


def test_trained_models_follow_the_same_rule(tmp_path):
    "The common base and a student are found under their config hash: unchanged, nothing retrains; a student setting retrains the student only; a filter setting (its SFT set) retrains it too."
    run = Run(tmp_path / "run", "smoke", tasks=SMALL)
    coa = student_named("coa")
    student = train_student(run, run.sft, coa)
    base, first = _trained(run.dir / "sft" / "base"), _trained(student)
    assert train_student(Run(tmp_path / "run", "smoke", tasks=SMALL), run.sft, coa) == student and _trained(student) == first
    assert train_student(run, replace(run.sft, lanes=2, eval_dtype="bfloat16"), coa) and _trained(student) == first   # unkeyed fields
    train_student(run, replace(run.sft, lr=5e-4), coa)
    assert _trained(student)[0] != first[0] and built_record(student)["config"]["lr"] == 5e-4
    assert _trained(run.dir / "sft" / "base") == base                                    # the base did not change
    again = _trained(student)
    train_student(replace(run, filter=replace(run.filter, cap_per_task=1)), replace(run.sft, lr=5e-4), coa)
    assert _trained(student)[0] != again[0]                                              # its SFT set changed


def test_a_model_of_an_earlier_version_is_adopted_or_retrained(tmp_path):
    "A student an earlier version trained (its record inside, no marker): adopted at the same settings, trained again at others."
    run = Run(tmp_path / "run", "smoke", tasks=SMALL)
    coa = student_named("coa")
    student = train_student(run, run.sft, coa)
    record = built_record(student)
    atomic_write_json(student / "sft_done.json", {k: v for k, v in record.items() if k != "config_hash"})   # as earlier versions wrote it
    done_marker(student).unlink()
    train_student(run, run.sft, coa)
    assert built_record(student)["wall_s"] == record["wall_s"] and built_record(student)["config_hash"] == record["config_hash"]
    done_marker(student).unlink()
    train_student(run, replace(run.sft, lr=5e-4), coa)                                   # other settings: not adopted
    assert built_record(student)["config"]["lr"] == 5e-4 and not (student / "sft_done.json").exists()
