"""The SFT trainer under `accelerate launch` with 2 CPU processes (configs/cpu_2proc.yaml) equals 1 process.

2 processes x batch b and 1 process x batch 2b see the same rows in every optimizer step (accelerate gives the
processes consecutive batches of one shuffled order), and with rows of equal length (no padding, equal token counts)
the averaged gradients are the full batch's: the losses and the weights must agree up to float rounding."""
import json, os, random, subprocess, sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from coa_lib.core import built_record
from coa_lib.llm import build_tiny_qwen2
from coa_lib.tokenizer import build_tokenizer

REPO = Path(__file__).resolve().parent.parent
JOB = Path(__file__).resolve().parent / "sft_ddp_job.py"
CONFIG = REPO / "configs" / "cpu_2proc.yaml"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
TOL = 1e-5     # losses and weights after 4 steps; measured differences are ~5e-7 (float sums in another order)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    "A nano Qwen2 with its tokenizer and 32 pre-tokenized rows of 48 tokens (16 prompt tokens without loss)."
    work = tmp_path_factory.mktemp("ddp")
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "Velmora", "1932", "<answer>", "</answer>"]
    tok = build_tokenizer([" ".join(rng.choice(words) for _ in range(30)) for _ in range(200)], vocab_size=400)
    build_tiny_qwen2(tok, "nano", seed=0).save_pretrained(str(work / "init")); tok.save_pretrained(str(work / "init"))
    rows = []
    for _ in range(32):
        ids = [rng.randrange(10, len(tok)) for _ in range(48)]
        rows.append({"input_ids": ids, "labels": [-100] * 16 + ids[16:]})
    (work / "rows.json").write_text(json.dumps(rows))
    return work


def run(cmd: list[str], out: Path) -> dict:
    "Run one SFT job; its losses, weights and the log of who wrote what."
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    writes = [line.split(" ", 1) for line in Path(f"{out}.writes").read_text().splitlines()]
    return {"losses": [h["loss"] for h in json.loads((out / "loss_history.json").read_text())],
            "weights": load_file(str(out / "model.safetensors")), "writes": writes,
            "done": built_record(out)}


def test_two_processes_train_like_one(work, tmp_path):
    "Equal losses and weights; one process writes the run dir; an interrupted 2-process run resumes to the same weights."
    one = run([sys.executable, str(JOB), str(work), "8", str(tmp_path / "one")], tmp_path / "one")
    accelerate = str(Path(sys.executable).parent / "accelerate")
    two = run([accelerate, "launch", "--config_file", str(CONFIG), str(JOB), str(work), "4", str(tmp_path / "two")],
              tmp_path / "two")
    assert one["done"]["processes"] == 1 and two["done"]["processes"] == 2
    assert len(one["losses"]) == len(two["losses"]) == 4
    assert max(abs(a - b) for a, b in zip(one["losses"], two["losses"])) < TOL, (one["losses"], two["losses"])
    w1, w2 = one["weights"], two["weights"]
    assert w1.keys() == w2.keys()
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) < TOL
    assert max(float((w1[k] - load_file(str(work / "init" / "model.safetensors"))[k]).abs().max()) for k in w1) > 1e-4  # it trained
    # the run dir is written by one process: every file once, by rank 0
    paths = [p for _, p in two["writes"]]
    assert {r for r, _ in two["writes"]} == {"0"} and len(paths) == len(set(paths)), two["writes"]
    assert {Path(p).name for p in paths} == {"loss_history.json", "building.json", "two.done", "model"}
    # killed after the checkpoint of step 2 of 4, then run again: it resumes on both processes and ends where `two` ended
    job2 = [accelerate, "launch", "--config_file", str(CONFIG), str(JOB), str(work), "4", str(tmp_path / "resumed")]
    killed = subprocess.run(job2 + ["4", "2", "2"], env=ENV, capture_output=True, text=True, timeout=600)
    assert killed.returncode == 0 and built_record(tmp_path / "resumed") is None, killed.stderr[-3000:]
    assert (tmp_path / "resumed" / "checkpoints" / "checkpoint-2").is_dir()
    resumed = run(job2 + ["4", "2"], tmp_path / "resumed")
    assert resumed["done"]["resumed_from"].endswith("checkpoint-2") and resumed["done"]["global_step"] == 4
    assert max(abs(a - b) for a, b in zip(resumed["losses"], two["losses"])) < TOL, (resumed["losses"], two["losses"])
    assert max(float((resumed["weights"][k] - w2[k]).abs().max()) for k in w2) < TOL


def test_stage_command_under_accelerate(tmp_path):
    "`prepare`, then `train-student` under the 2-process launcher, then `select-rl` and `train-rl`; a launcher never builds artifacts."
    accelerate = str(Path(sys.executable).parent / "accelerate")
    launch = [accelerate, "launch", "--config_file", str(CONFIG), "-m", "coa_lib.stages", "train-student", "--profile", "smoke",
              "--student", "coa", "--max-steps", "2"]
    empty = subprocess.run(launch + ["--run-dir", str(tmp_path / "empty")], env=ENV, capture_output=True, text=True, timeout=600)
    assert empty.returncode != 0 and "build it in one process first" in empty.stdout + empty.stderr
    rd = tmp_path / "run"
    prep = subprocess.run([sys.executable, "-m", "coa_lib.stages", "prepare", "--run-dir", str(rd), "--profile", "smoke"],
                          env=ENV, capture_output=True, text=True, timeout=600)
    assert prep.returncode == 0, prep.stderr[-3000:]
    p = subprocess.run(launch + ["--run-dir", str(rd)], env=ENV, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    done = built_record(rd / "sft" / "coa")
    assert done["processes"] == 2 and done["global_step"] == 2 and done["precision"]["bf16"] is False
    assert built_record(rd / "sft" / "base")["processes"] == 2   # the base trained distributed too
    # the RL stage the same way: the selection in one process (a launcher refuses to make it), then DAPO on 2 processes
    rl = [accelerate, "launch", "--config_file", str(CONFIG), "-m", "coa_lib.stages", "train-rl", "--profile", "smoke", "--run-dir", str(rd)]
    refused = subprocess.run(rl, env=ENV, capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0 and "select-rl` in one process first" in refused.stdout + refused.stderr
    sel = subprocess.run([sys.executable, "-m", "coa_lib.stages", "select-rl", "--run-dir", str(rd), "--profile", "smoke"],
                         env=ENV, capture_output=True, text=True, timeout=600)
    assert sel.returncode == 0, sel.stderr[-3000:]
    p = subprocess.run(rl, env={**ENV, "TRL_EXPERIMENTAL_SILENCE": "1"}, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rl_done = built_record(rd / "rl" / "coa_rl")
    assert rl_done["global_step"] == 4 and (rd / "rl" / "coa_rl" / "model.safetensors").exists()


def test_launch_configs_load_and_name_known_options():
    "Every configs/*.yaml loads with accelerate, and its FSDP / DeepSpeed keys are options accelerate's launcher knows."
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser
    known = {o.lstrip("-") for a in launch_command_parser()._actions for o in a.option_strings}
    files = sorted((REPO / "configs").glob("*.yaml"))
    assert {f.name for f in files} >= {"cpu_2proc.yaml", "gpu_1.yaml", "gpu8_ddp.yaml", "gpu8_fsdp.yaml", "gpu8_zero3.yaml"}
    for f in files:
        cfg = load_config_from_file(str(f))
        assert cfg.num_processes >= 1, f
        for key in {**(cfg.fsdp_config or {}), **(cfg.deepspeed_config or {})}:
            assert key in known, f"{f.name}: {key} is not an accelerate launch option"
