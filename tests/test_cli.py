"The stage commands (`python -m coa_lib.stages`, `coa_lib.flow_stages`), `make lab`, and what training leaves behind: TensorBoard events, no warnings of ours."
import argparse, json, os, re, selectors, signal, socket, subprocess, sys, time, urllib.error, urllib.request, warnings
from dataclasses import asdict, replace
from pathlib import Path

import pytest

import coa_lib.stages as stages
from coa_lib.core import SPLITS, atomic_write_json, done_marker, mark_built
from coa_lib.distill import DISTILLERS
from coa_lib.filtering import SFT_SETS
from coa_lib.rl import RLConfig

REPO = Path(__file__).resolve().parents[1]
STAGE_FUNCTIONS = ("run_teacher_stage", "teacher_eval", "build_sft_sets", "train_student", "rl_selection", "train_rl_student", "run_rl_stage")

PREPARED = [f"tasks_{s}" for s in SPLITS] + ["student_tokenizer", "teacher_traces", "teacher_eval"] + [f"distilled_{f}" for f in DISTILLERS] + list(SFT_SETS)


@pytest.fixture
def no_stage_runs(monkeypatch):
    "Every stage function of coa_lib.stages fails the test if called: a command that refuses must not start one."
    def started(*a, **k): raise AssertionError("a stage started")
    for name in STAGE_FUNCTIONS: monkeypatch.setattr(stages, name, started)


def run(main, argv, capsys) -> tuple[int, str]:
    "Exit code and output (stdout + stderr) of an in-process command; argparse refuses through SystemExit."
    try: code = main([str(a) for a in argv])
    except SystemExit as e: code = e.code
    out = capsys.readouterr()
    return code, out.out + out.err


def prepared_run(rd: Path, rl_done: dict | None = None) -> Path:
    "A run dir whose CoA half looks built up to the SFT student (markers and done-files only), and optionally the RL model."
    for name in PREPARED: mark_built(rd / name)
    mark_built(rd / "sft" / "coa", {"config": {"profile": "smoke"}})
    if rl_done is not None:
        atomic_write_json(rd / "rl" / "selection.json", {"key": {"profile": "smoke"}, "pool": [], "selected": []})
        mark_built(rd / "rl" / "coa_rl", rl_done)
    return rd


BAD = [["train-rl", "--lr", "inf"], ["train-rl", "--lr", "nan"], ["train-rl", "--lr", "-1"], ["train-rl", "--rollout-batches", "0"],
       ["train-rl", "--rollout-batches", "-3"], ["train-student", "--max-steps", "0"], ["train-student", "--batch-size", "-2"],
       ["train-student", "--lr", "0"], ["train-student", "--base", "/no/such/model"], ["prepare", "--teacher-workers", "0"],
       ["prepare", "--teacher-endpoint", "localhost:8000", "--teacher-model", "m"], ["prepare", "--teacher-endpoint", "http://localhost:8000/v1"]]


@pytest.mark.parametrize("argv", BAD, ids=[" ".join(a) for a in BAD])
def test_bad_values_are_refused_before_anything_starts(argv, tmp_path, capsys, no_stage_runs):
    rd = tmp_path / "run"
    code, out = run(stages.main, [argv[0], "--run-dir", rd, *argv[1:]], capsys)
    assert code == 2 and "error:" in out and "Traceback" not in out, out
    assert not rd.exists()


@pytest.mark.parametrize("bad", ["", " ", "a_file", "a_file/run"])
def test_a_run_dir_that_is_empty_or_a_file_is_refused(bad, tmp_path, capsys, no_stage_runs, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("")
    code, out = run(stages.main, ["select-rl", "--run-dir", bad], capsys)
    assert code == 2 and "argument --run-dir" in out, out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]                 # nothing written in the current directory


def test_missing_upstream_is_named_and_not_built(tmp_path, capsys, no_stage_runs):
    rd = tmp_path / "never_made"
    code, out = run(stages.main, ["select-rl", "--run-dir", rd], capsys)
    assert code == 2 and "select-rl needs prepare, train-student --student coa, not built" in out and "--build-upstream" in out, out
    assert not rd.exists()


def test_build_upstream_names_the_stages_then_builds_them_in_order(tmp_path, capsys, monkeypatch):
    calls = []
    def record(name, result):
        def f(*a, **k): calls.append(name); return result
        return f
    for name, result in [("run_teacher_stage", None), ("teacher_eval", None), ("build_sft_sets", {}), ("train_student", tmp_path / "sft"),
                         ("rl_selection", {"selected": ["t1"], "pool": ["t1", "t2"]})]:
        monkeypatch.setattr(stages, name, record(name, result))
    code, out = run(stages.main, ["select-rl", "--run-dir", tmp_path / "run", "--build-upstream"], capsys)
    assert code == 0, out
    assert "building the upstream stages first: prepare, train-student --student coa" in out and "1 of 2 training tasks selected" in out
    assert calls == ["run_teacher_stage", "teacher_eval", "build_sft_sets", "train_student", "rl_selection"]


def test_under_a_launcher_missing_upstream_is_a_message_not_a_traceback(tmp_path, capsys, monkeypatch, no_stage_runs):
    monkeypatch.setenv("WORLD_SIZE", "2")
    rd = prepared_run(tmp_path / "run")
    code, out = run(stages.main, ["train-rl", "--run-dir", rd], capsys)
    assert code == 2 and "select-rl` in one process first" in out and "Traceback" not in out, out
    code, out = run(stages.main, ["select-rl", "--run-dir", tmp_path / "empty", "--build-upstream"], capsys)
    assert code == 2 and "build it in one process first" in out, out                  # a launcher never builds upstream


def test_a_student_of_an_earlier_version_counts_as_built_upstream(tmp_path, capsys, monkeypatch):
    "A student an earlier version finished (its `sft_done.json` inside, no marker) counts as built: train-rl starts (the stage adopts or retrains it) instead of asking to build it."
    rd = prepared_run(tmp_path / "run")
    done_marker(rd / "sft" / "coa").unlink()
    atomic_write_json(rd / "sft" / "coa" / "sft_done.json", {"config": {"profile": "smoke", "lr": 1e-3}})
    monkeypatch.setattr(stages, "rl_selection", lambda *a, **k: {"pool": [], "selected": []})
    monkeypatch.setattr(stages, "train_rl_student", lambda *a, **k: "RL started")
    code, out = run(stages.main, ["train-rl", "--run-dir", rd, "--build-upstream"], capsys)
    assert code == 0 and "train-student" not in out and "RL started" in out, out
    code, out = run(stages.main, ["train-student", "--run-dir", rd, "--student", "coa", "--lr", "5e-4"], capsys)
    assert code == 2 and "lr 0.001 (built) vs 0.0005 (asked)" in out, out            # and its recorded settings are compared as a marker's


def test_a_finished_rl_stage_is_not_rewritten_with_other_settings(tmp_path, capsys, no_stage_runs):
    rd = prepared_run(tmp_path / "run", {"config": asdict(RLConfig.for_profile("smoke")), "global_step": 4})
    before = done_marker(rd / "rl" / "coa_rl").read_bytes()
    code, out = run(stages.main, ["train-rl", "--run-dir", rd], capsys)
    assert code == 0 and "train-rl: done" in out, out                               # same settings: done, nothing run
    for other in (["--lr", "1e-3"], ["--rollout-batches", "3"], ["--profile", "full"]):
        code, out = run(stages.main, ["train-rl", "--run-dir", rd, *other], capsys)
        assert code == 2 and "other settings" in out and "--rebuild" in out, out
    assert done_marker(rd / "rl" / "coa_rl").read_bytes() == before


def test_rebuild_discards_the_stage_then_trains_and_names_what_is_out_of_date(tmp_path, capsys, monkeypatch):
    old = {"config": asdict(RLConfig.for_profile("smoke")), "global_step": 4}
    rd = prepared_run(tmp_path / "run", old)
    atomic_write_json(rd / "rl_results.json", {"config": old["config"], "training": old})     # eval-rl of the old model
    seen = []
    def train(run_dir, cfg):
        assert not (rd / "rl" / "coa_rl").exists()                                     # removed before training
        mark_built(rd / "rl" / "coa_rl", {"config": asdict(cfg), "global_step": 4})
        seen.append(cfg.lr); return rd / "rl" / "coa_rl"
    monkeypatch.setattr(stages, "train_rl_student", train)
    code, out = run(stages.main, ["train-rl", "--run-dir", rd, "--lr", "1e-3", "--rebuild"], capsys)
    assert code == 0 and seen == [1e-3], out
    assert "note: eval-rl was built from the previous train-rl" in out


def test_every_stage_has_a_command_with_help_and_an_example():
    from coa_lib.cli import stage_parser
    from coa_lib.flow_stages import AFM_COMMANDS, FLOW_COMMANDS
    commands = {**AFM_COMMANDS, **FLOW_COMMANDS}
    assert set(FLOW_COMMANDS) == {"warm-start", "eval-agentflow", "train-flow-grpo", "offline-sft", "flow-ablations"}
    ap = stage_parser(commands, "prog", "")
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        no_help = [a.dest for a in p._actions if not a.help]
        assert not no_help, f"{name}: options without help: {no_help}"
        assert f"prog {commands[name].example}" in p.format_help() and commands[name].example.startswith(name + " ")
    for module, names in (("coa_lib.stages", AFM_COMMANDS), ("coa_lib.flow_stages", commands)):
        p = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and all(f"{module} {n} --run-dir" in p.stdout for n in names), p.stdout + p.stderr
    assert "coa_lib.flow_stages --help" in subprocess.run([sys.executable, "-m", "coa_lib.stages", "--help"],
                                                         capture_output=True, text=True, timeout=120).stdout


def test_a_flow_command_refuses_missing_upstream(tmp_path, capsys, monkeypatch):
    import coa_lib.flow_stages as fs
    for name in ("planner_warm_start", "run_agentflow_stage", "flow_grpo_planner", "offline_sft_planner", "flow_grpo_ablations"):
        monkeypatch.setattr(fs, name, lambda *a, **k: pytest.fail("a stage started"))
    rd = prepared_run(tmp_path / "run")                                                  # the CoA student is there, the warm start is not
    code, out = run(fs.main, ["flow-ablations", "--run-dir", rd], capsys)
    assert code == 2 and "flow-ablations needs warm-start, train-flow-grpo, offline-sft, not built" in out, out


# --- what training leaves behind -----------------------------------------------------------------------------------

def test_our_training_arguments_raise_no_deprecation_warning(tmp_path):
    "The TrainingArguments we build (SFT, RL) use transformers 5's names: no FutureWarning from our own calls."
    from coa_lib.sft import SFTStageConfig, _trainer_args
    from coa_lib.rl import grpo_args
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _trainer_args(tmp_path, SFTStageConfig(max_steps=2), 2, False, False)
        grpo_args(tmp_path, RLConfig.for_profile("smoke"))
    assert not [str(w.message) for w in seen if issubclass(w.category, (FutureWarning, DeprecationWarning))]


def test_a_tiny_sft_run_writes_tensorboard_events(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from coa_lib.llm import build_tiny_qwen2
    from coa_lib.sft import SFTStageConfig, train_sft
    from coa_lib.tokenizer import build_tokenizer
    rows = [{"prompt": f"<|im_start|>user\nWho made {x}?<|im_end|>\n<|im_start|>assistant\n", "completion": f"<answer>{x} maker</answer>"}
            for x in ("Blue Harbor", "Red Mill", "Grey Lake", "Old Pier")]
    tok = build_tokenizer([r["prompt"] + r["completion"] for r in rows] * 10, vocab_size=300)
    out = train_sft(rows * 2, build_tiny_qwen2(tok, "nano"), tmp_path / "sft", SFTStageConfig(max_steps=2, batch_size=2, logging_steps=1),
                    tokenizer=tok)
    events = sorted(out.rglob("events.out.tfevents.*"))
    assert events, f"no TensorBoard event file under {out}"
    acc = EventAccumulator(str(events[0].parent)); acc.Reload()
    assert "train/loss" in acc.Tags()["scalars"] and len(acc.Scalars("train/loss")) == 2


def test_a_tiny_rl_run_writes_tensorboard_events(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from coa_lib.rl import train_rl
    from coa_lib.toy import ToyToolBox, ToyTrainConfig, build_toy_agent, toy_tasks, toy_world
    model, tok, _ = build_toy_agent(ToyTrainConfig(steps=5, batch_size=8, lr=3e-3, size="nano"), progress=False)
    table = toy_world(99); tasks = toy_tasks(table, 8, seed=4)
    cfg = RLConfig(group_size=4, groups_per_batch=2, minibatches=2, rollout_batches=1, max_turns=3, max_new_tokens=24, max_total_tokens=400,
                   dev_every=1, n_dev=1, save_every=1, max_refill_rounds=1)
    out = train_rl(model.float(), tasks, tasks[:2], tmp_path / "rl", cfg, tokenizer=tok, toolbox=ToyToolBox(table))
    events = sorted(out.rglob("events.out.tfevents.*"))
    assert events, f"no TensorBoard event file under {out}"
    acc = EventAccumulator(str(events[0].parent)); acc.Reload()
    assert "train/loss" in acc.Tags()["scalars"]


def test_rl_quiets_the_tensorboard_notice_for_metrics_trl_logs_as_none(tmp_path, monkeypatch):
    "TRL logs a clip metric as None when no token was clipped; transformers' TensorBoard callback then warns on every step."
    import logging
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))   # else the callback's writer opens runs/<date>_<host> in the repo
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.integrations import TensorBoardCallback
    from coa_lib.rl import _quiet_trl
    args, state, cb = TrainingArguments(output_dir=str(tmp_path), report_to=[]), TrainerState(), TensorBoardCallback()
    seen, handler, log = [], logging.Handler(), logging.getLogger("transformers.integrations.integration_utils")
    handler.emit = lambda record: seen.append(record.getMessage())
    log.addHandler(handler)
    try:
        cb.on_log(args, state, TrainerControl(), logs={"clip_ratio/low_min": None, "loss": 1.0})
        assert len(seen) == 1 and "NoneType" in seen[0], seen                          # the notice, outside RL training
        with _quiet_trl(): cb.on_log(args, state, TrainerControl(), logs={"clip_ratio/low_min": None, "loss": 0.5})
        assert len(seen) == 1, seen
    finally:
        log.removeHandler(handler); cb.on_train_end(args, state, TrainerControl())
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))                        # its events went to the test's folder


# --- make ----------------------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "jupyter").exists(), reason="make lab runs the checkout's .venv")
def test_make_lab_starts_and_prints_its_url(tmp_path):
    "`make lab` starts JupyterLab (as root too, where Jupyter needs --allow-root) and prints a URL that answers."
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path)}
    p = subprocess.Popen(["make", "-o", ".venv/.installed", "lab", f"LAB_PORT={_free_port()}"], cwd=REPO, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        sel, lines, url = selectors.DefaultSelector(), [], None
        sel.register(p.stdout, selectors.EVENT_READ)
        deadline = time.time() + 120
        while url is None and time.time() < deadline and p.poll() is None:
            if sel.select(timeout=1):
                lines.append(p.stdout.readline())
                if (m := re.search(r"http://127\.0\.0\.1:\d+/lab\?token=\w+", lines[-1])): url = m.group(0)
        assert url, "no URL printed:\n" + "".join(lines)
        while True:                                                                     # it prints the URL as the server starts listening
            try:
                with urllib.request.urlopen(url, timeout=30) as r: assert r.status == 200
                break
            except urllib.error.URLError:
                assert time.time() < deadline and p.poll() is None, "the URL never answered:\n" + "".join(lines)
                time.sleep(0.5)
    finally:
        if p.poll() is None: os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=60)
