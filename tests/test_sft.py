"SFT: observation masking proved through the trainer's own loss; a tiny train_sft run that saves, loads, generates, resumes."
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, TrainerCallback

from coa_lib.core import built_record
from coa_lib.format import format_observation, observation_char_spans
from coa_lib.llm import build_tiny_qwen2, load_policy
from coa_lib.tokenizer import build_tokenizer
from coa_lib.sft import (IGNORE, SFTStageConfig, build_sft_trainer, encode_sft_row, last_checkpoint, replace_token,
                         sft_loss, tokenize_sft, train_sft)

PROMPT = "<|im_start|>user\nWho directed {film}?<|im_end|>\n<|im_start|>assistant\n"


def trajectory(film: str, person: str) -> str:
    return (f"<think>Search {film}.</think>\n<web_search>{film}</web_search>"
            + format_observation(f"{film} is a film directed by {person}. It was shot in Orsk.")
            + f"<think>{person} directed it.</think>\n<answer>{person}</answer>")


FILMS = [("Blue Harbor", "Ana Vell"), ("Red Mill", "Tom Osk"), ("Grey Lake", "Ida Marr"), ("Old Pier", "Lev Sand")]
ROWS = [{"prompt": PROMPT.format(film=f), "completion": trajectory(f, p)} for f, p in FILMS]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer([r["prompt"] + r["completion"] for r in ROWS] * 10, vocab_size=420)


@pytest.fixture(scope="module", params=[False, True], ids=["plain_loss", "trl_fused_loss"])
def trainer(tok, tmp_path_factory, request):
    "Both loss paths: the model's own loss (`train_sft`'s default) and TRL's fused one (`token_metrics=True`)."
    model = build_tiny_qwen2(tok, "nano", init_std=0.2)   # a wide init: random logits far from uniform
    return build_sft_trainer(tokenize_sft(ROWS, tok), model, tok, tmp_path_factory.mktemp("tr"),
                             SFTStageConfig(batch_size=2, save_steps=1000, token_metrics=request.param), max_steps=1)


def test_trl_keeps_our_labels(tok, trainer):
    "TRL's dataset preparation must not rebuild or drop the labels we hand it."
    ours = tokenize_sft(ROWS, tok)
    assert trainer.train_dataset.num_rows == len(ROWS)
    got = {tuple(r["input_ids"]): r["labels"] for r in trainer.train_dataset}
    for r in ours: assert got[tuple(r["input_ids"])] == r["labels"]


def test_observation_tokens_never_scored(tok):
    for r in ROWS:
        e = encode_sft_row(r["prompt"], r["completion"], tok)
        scored = tok.decode([i for i, l in zip(e["input_ids"], e["labels"]) if l != IGNORE])
        obs = [r["completion"][a:b] for a, b in observation_char_spans(r["completion"])]
        assert scored == r["completion"].replace(obs[0], "")
        assert "<observation>" not in scored and "shot in Orsk" not in scored


def test_changing_an_observation_token_leaves_the_loss_unchanged(tok, trainer):
    "Cut right after the observation: every observation token changed in turn, the loss is bit-identical."
    r = ROWS[0]
    cut = r["completion"][:observation_char_spans(r["completion"])[0][1]]
    row = encode_sft_row(r["prompt"], cut, tok)
    n_prompt = len(tok(r["prompt"], add_special_tokens=False)["input_ids"])
    obs = [k for k, l in enumerate(row["labels"]) if l == IGNORE and k >= n_prompt]
    own = [k for k, l in enumerate(row["labels"]) if l != IGNORE]
    assert len(obs) > 10 and len(own) > 5
    base = sft_loss(trainer, [row])
    for new in (tok.convert_tokens_to_ids("<answer>"), 300):
        for k in obs: assert sft_loss(trainer, [replace_token(row, k, new)]) == base, k
        for k in own[1:]: assert abs(sft_loss(trainer, [replace_token(row, k, new)]) - base) > 1e-6, k


def test_loss_is_mean_over_model_written_tokens_only(tok, trainer):
    "In whole trajectories (observations mid-sequence) the loss is the CE averaged over exactly the model-written tokens."
    rows = [encode_sft_row(r["prompt"], r["completion"], tok) for r in ROWS[:2]]
    got = sft_loss(trainer, rows)
    model = trainer.model.eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for e in rows:
            logits = model(torch.tensor([e["input_ids"]])).logits[0, :-1].float()
            tgt = torch.tensor(e["labels"][1:])
            keep = tgt != IGNORE
            total += float(torch.nn.functional.cross_entropy(logits[keep], tgt[keep], reduction="sum")); n += int(keep.sum())
    assert n == sum(sum(l != IGNORE for l in e["labels"][1:]) for e in rows)
    assert abs(got - total / n) < 1e-4


class _StopAfterSave(TrainerCallback):
    "Simulates a crash: raises right after the checkpoint of step `at` is saved."
    def __init__(self, at): self.at = at
    def on_save(self, args, state, control, **kw):
        if state.global_step == self.at: raise KeyboardInterrupt("simulated kill")


class _FirstStep(TrainerCallback):
    def __init__(self): self.first = None
    def on_step_end(self, args, state, control, **kw):
        if self.first is None: self.first = state.global_step


def test_train_save_load_generate_and_resume(tok, tmp_path):
    cfg = SFTStageConfig(size="nano", batch_size=2, max_steps=4, save_steps=2, logging_steps=1, warmup_steps=1, max_len=256)
    out = tmp_path / "student"
    with pytest.raises(KeyboardInterrupt):
        train_sft(tokenize_sft(ROWS * 3, tok), build_tiny_qwen2(tok, "nano"), out, cfg, tokenizer=tok, callbacks=[_StopAfterSave(2)])
    assert last_checkpoint(out).name == "checkpoint-2" and built_record(out) is None
    first = _FirstStep()
    path = train_sft(ROWS * 3, build_tiny_qwen2(tok, "nano"), out, cfg, tokenizer=tok, callbacks=[first])
    done = built_record(path)
    assert first.first == 3, "the re-run must continue at step 3, not restart"
    assert done["global_step"] == 4 and done["resumed_from"].endswith("checkpoint-2")
    hist = json.loads((path / "loss_history.json").read_text())
    assert [h["step"] for h in hist] == [1, 2, 3, 4]   # the resumed history carries the steps before the kill
    assert (path / "loss.png").stat().st_size > 0
    pol = load_policy(path)
    c = pol.generate([ROWS[0]["prompt"]], max_new_tokens=5)[0]
    assert c.prompt_tokens > 0 and c.completion_tokens > 0
    tuned = train_sft(ROWS, path, tmp_path / "from_path", SFTStageConfig(max_steps=2, batch_size=2, save_steps=100))   # base = a saved HF dir
    assert built_record(tuned)["global_step"] == 2 and load_policy(tuned).generate(["x"], max_new_tokens=2)
    again = _FirstStep()   # finished: a third call returns at once without training
    assert train_sft(ROWS * 3, build_tiny_qwen2(tok, "nano"), out, cfg, tokenizer=tok, callbacks=[again]) == path
    assert again.first is None


def test_bad_rows_are_named(tok):
    with pytest.raises(ValueError, match="SFT row 1: field 'completion'"):
        tokenize_sft([ROWS[0], {"prompt": "p", "completion": 3}], tok)


def test_run_in_lanes_keeps_job_order_and_raises_worker_errors():
    import operator
    from coa_lib.stage_sft import run_in_lanes
    assert run_in_lanes(operator.add, [(1, 2), (3, 4), (5, 6)], lanes=2, threads=1) == [3, 7, 11]
    assert run_in_lanes(operator.add, [(1, 2), (3, 4)], lanes=1) == [3, 7]
    with pytest.raises(TypeError):
        run_in_lanes(operator.add, [(1, 2), (3, "x")], lanes=2, threads=1)


def test_quote_rows_cue_says_where_and_the_quote_is_verbatim():
    from coa_lib.sft import quote_rows
    pages = [f"Zibri{i} is a city in Bazuland. Zibri{i} was founded in {1100 + i}. Zibri{i} is a city." for i in range(20)]
    rows = quote_rows(pages, 200, seed=3)
    assert len(rows) == 200 and rows == quote_rows(pages, 200, seed=3)
    for r in rows:
        context, cue = r["prompt"].rsplit("\nQuote:", 1)
        words, c = context.split(" "), cue.split()
        assert sum(words[i:i + len(c)] == c for i in range(len(words))) == 1, cue     # the cue occurs once: it says where
        assert (cue + r["completion"]).strip() in context and r["completion"].startswith(" ")
    with pytest.raises(ValueError, match="repeat themselves"):
        quote_rows(["la la la la la la la la la la"], 5)


def test_lanes_die_with_a_killed_parent(tmp_path):
    # a batch killed with SIGKILL must not leave lane processes training on into the run dir
    import os, signal, subprocess, sys, time
    (tmp_path / "lane_job.py").write_text(
        "import os, time\n"
        "def job(path):\n"
        "    open(path, 'w').write(str(os.getpid())); time.sleep(120)\n")
    parent = ("import sys; sys.path.insert(0, sys.argv[1])\n"
              "from coa_lib.stage_sft import run_in_lanes\nimport lane_job\n"
              "run_in_lanes(lane_job.job, [(sys.argv[1] + '/a.pid',), (sys.argv[1] + '/b.pid',)], lanes=2, threads=1)\n")
    p = subprocess.Popen([sys.executable, "-c", parent, str(tmp_path)], start_new_session=True)
    pids, deadline = [], time.time() + 120
    while len(pids) < 2:
        assert time.time() < deadline and p.poll() is None, "the lanes never started"
        time.sleep(0.2)
        pids = [int(f.read_text()) for f in tmp_path.glob("*.pid") if f.read_text()]
    p.kill(); p.wait()                                                 # SIGKILL the parent only, not its group
    deadline = time.time() + 10
    from procs import is_live
    alive = lambda: [q for q in pids if is_live(q)]
    while alive() and time.time() < deadline: time.sleep(0.2)
    left = alive()
    for q in left: os.kill(q, signal.SIGKILL)
    assert not left, f"lane processes {left} outlived their killed parent"


def test_a_finished_model_is_found_before_loading_or_tokenizing(tmp_path):
    # a model built under the config's key must not reload a base or re-tokenize rows; another config trains again
    from dataclasses import asdict
    from coa_lib.core import atomic_write_json, mark_built
    from coa_lib.sft import SFTStageConfig, sft_key, train_sft
    rows, out, cfg = [{"prompt": "p", "completion": "c"}], tmp_path / "student", SFTStageConfig(max_steps=7)
    mark_built(out, {"max_steps": 7}, key=sft_key(cfg, "/nonexistent/model"))
    assert train_sft(rows, "/nonexistent/model", out, cfg) == out
    with pytest.raises(OSError):                                      # another step count: it does try to train (from a base that is not there)
        train_sft(rows, "/nonexistent/model", out, SFTStageConfig(max_steps=8))
    assert built_record(out) is None and [q.name for q in out.iterdir()] == ["building.json"]   # the other config's model went first
    earlier = tmp_path / "earlier"                                    # a model an earlier version finished (its record inside, no marker)
    atomic_write_json(earlier / "sft_done.json", {"max_steps": 7, "config": asdict(cfg)})
    assert train_sft(rows, "/nonexistent/model", earlier, cfg) == earlier and built_record(earlier)["max_steps"] == 7
    stale = tmp_path / "stale"
    atomic_write_json(stale / "sft_done.json", {"max_steps": 7, "config": asdict(SFTStageConfig(max_steps=7, lr=5e-3))})
    with pytest.raises(OSError):                                      # an earlier version's model of other settings: removed, trained again
        train_sft(rows, "/nonexistent/model", stale, cfg)


def test_tail_average_survives_a_kill_and_keeps_the_last_step(tok, tmp_path):
    "A run killed inside its averaged tail and resumed saves the same mean as an unbroken run; the last step's weights are kept beside it."
    cfg = SFTStageConfig(size="nano", batch_size=2, max_steps=6, save_steps=2, logging_steps=1, warmup_steps=1, max_len=256,
                         average_from=0.25, keep_last_iterate=True)
    whole = train_sft(ROWS * 3, build_tiny_qwen2(tok, "nano"), tmp_path / "whole", cfg, tokenizer=tok)
    assert built_record(whole)["averaged_steps"] == 5                       # steps 2..6: the share 2/6 is past 0.25, 1/6 is not
    with pytest.raises(KeyboardInterrupt):
        train_sft(ROWS * 3, build_tiny_qwen2(tok, "nano"), tmp_path / "cut", cfg, tokenizer=tok, callbacks=[_StopAfterSave(4)])
    assert (tmp_path / "cut" / "checkpoints" / "checkpoint-4" / "tail_average.pt").exists()
    cut = train_sft(ROWS * 3, build_tiny_qwen2(tok, "nano"), tmp_path / "cut", cfg, tokenizer=tok)
    assert built_record(cut)["averaged_steps"] == 5
    load = lambda p: dict(AutoModelForCausalLM.from_pretrained(str(p)).named_parameters())
    for name, p in load(whole).items():
        torch.testing.assert_close(p, load(cut)[name], atol=1e-5, rtol=0)
    moved = max((load(whole)[k] - q).abs().max().item() for k, q in load(whole / "last_iterate").items())
    assert moved > 1e-4, "the saved model must be the mean, not the last step's weights"
    with pytest.raises(ValueError, match="keep_last_iterate needs it"):
        SFTStageConfig(keep_last_iterate=True)
