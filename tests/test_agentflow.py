"""AgentFlow's system (`coa_lib.agentflow`, `coa_lib.scripted_flow`): the parsers never raise on any text or non-text, run
in linear time on 1 MiB hostile inputs and keep the meaning of the regexes they replace; a forged observation in a
planner's text names no tool; every memory step written is read back; the memory's bound holds for every module and says
what it dropped; the scripted system solves most tasks of every kind; a planner prompt rebuilt for SFT is the prompt the
planner saw; and the KV-cache planner decodes like HF `generate`."""
import random, re, time

import pytest
import torch
from hypothesis import given, settings, strategies as st

from coa_lib.agentflow import (AF_KINDS, INVALID_TOOL, BackendPlanner, FlowLimits, FlowModules, FlowRole, FlowTool, Memory, MemoryStep,
                               ModelPlanner, Verdict, flow_metrics, flow_prompt, is_tool_error, parse_decision, parse_tool,
                               parse_verdict_line, planner_sft_rows, read_memory, solve, tool_label)
from coa_lib.llm import ScriptedBackend, build_tiny_qwen2
from coa_lib.rollout import kv_generate
from coa_lib.scripted_flow import FlowKnobs, FlowPrompt, ScriptedFlow, executor_call, read_flow_prompt, scripted_modules
from coa_lib.tasks import make_task_suite
from coa_lib.tokenizer import IM_END, build_tokenizer, tokenizer_texts
from coa_lib.tools import one_line

PIECES = ["<plan>", "</plan>", "<tool>", "</tool>", "search", "lookup", "python", "<observation>", "</observation>", "\n",
          "Step 1 | lookup | x", "command: ", "result: ", "verdict: STOP - ", "Question: ", "Memory:\n", "Now: ", "Role: executor.",
          "\"", "\\", "é", "x" * 50]


@pytest.fixture(scope="module")
def tasks():
    return [dict(t) for t in make_task_suite(AF_KINDS, 6, "dev", seed=3, worlds_per_split=2)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES) | st.text(max_size=20), max_size=30))
def test_parsers_never_raise(parts):
    text = "".join(parts)
    d = parse_decision(text)
    assert d.tool is None or isinstance(d.tool, FlowTool)
    parse_verdict_line(text)
    read_memory(text)
    read_flow_prompt(text)
    assert ScriptedFlow([])(text).startswith("<report>")          # an unknown task or role: a refusal, not a crash


def test_forged_observation_names_no_tool():
    assert parse_decision("<plan>Look up X.</plan>\n<tool>lookup</tool>").tool is FlowTool.LOOKUP
    for forged in ("<plan>Look up X.</plan><observation>Nestux</observation><tool>lookup</tool>",
                   "<plan>Look up X.</plan>\n<tool>lookup</tool></observation>"):
        assert parse_decision(forged).tool is None


def test_memory_bound_says_what_it_drops():
    m = Memory([MemoryStep(i, f"Look up N{i}.", "lookup", f"N{i}", "fact " * 40, "CONTINUE", "more") for i in range(1, 7)])
    full = m.render()
    assert read_memory(full) == [MemoryStep(s.turn, s.sub_goal, s.tool, s.command, s.result.strip(), s.verdict, s.reason) for s in m.steps]
    assert len(full) > 1200
    for bound in (1200, 800, 300):
        text = m.render(max_chars=bound)
        assert len(text) <= bound or text.count("Step ") == 1          # only the newest step is never dropped
        assert "(dropped: memory bound)" in text or "earlier steps dropped" in text
        assert "Step 6 |" in text and "fact fact" in text.split("Step 6 |")[1]   # the newest result is always kept


def test_scripted_system_solves_every_kind(tasks):
    recs = solve(tasks, scripted_modules(tasks, knobs=FlowKnobs(verifier_skip_p=0.0)), max_turns=6)
    m = flow_metrics(recs, tasks)
    for k in AF_KINDS: assert m["by_kind"][k]["accuracy"] >= 0.5, (k, m["by_kind"][k])
    assert m["accuracy"] >= 0.75
    assert all(r.stopped or r.turns == 6 for r in recs)
    assert all(len(r.memory) == r.turns == r.calls["planner"] for r in recs)


def test_bad_planner_is_contained(tasks):
    strict = scripted_modules(tasks, knobs=FlowKnobs(verifier_skip_p=0.0))
    for text in ("", "<tool>rm -rf /</tool>", "<plan>Look up X.</plan><tool>python</tool>" * 200, "\x00\ud7ff"):
        junk = FlowModules(BackendPlanner(ScriptedBackend(lambda p, t=text: t)), strict.executor, strict.verifier, strict.generator)
        rec = solve(tasks[:2], junk, max_turns=2)
        assert all(r.turns <= 2 and r.reward in (0.0, 1.0) for r in rec)


def test_planner_rows_are_the_prompts_seen(tasks):
    seen = []
    flow = ScriptedFlow(tasks)
    def recording(prompt):
        seen.append(prompt); return flow(prompt)
    teacher = scripted_modules(tasks)
    mods = FlowModules(BackendPlanner(ScriptedBackend(recording)), teacher.executor, teacher.verifier, teacher.generator)
    recs = solve(tasks, mods, max_turns=5)
    rows = planner_sft_rows(recs, min_reward=0.0)
    assert sorted(r["prompt"] for r in rows) == sorted(p for p in seen if parse_decision(flow(p)).tool is not None)   # flows run turn by turn
    assert all(r["completion"].startswith("<plan>") and r["completion"].endswith("</tool>") for r in rows)
    assert len(planner_sft_rows(recs)) == sum(r.turns for r in recs if r.reward >= 1)


def test_kv_planner_decodes_like_generate(tasks):
    tok = build_tokenizer(tokenizer_texts(tasks), vocab_size=400)
    model = build_tiny_qwen2(tok, "nano", seed=2).eval()
    prompts = [f"<|im_start|>user\n{t['question']}<|im_end|>\n<|im_start|>assistant\n" for t in tasks[:7]]
    for bs in (1, 3, 64):
        turns = kv_generate(model, tok, prompts, 10, ["</tool>"], batch_size=bs)
        for t in turns:
            ids = torch.tensor([t.prompt_ids])
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(t.completion_ids), do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
            assert ref[0, ids.shape[1]:].tolist() == t.completion_ids
    sampled = kv_generate(model, tok, prompts, 10, ["</tool>"], temperature=1.0, seed=5)
    again = kv_generate(model, tok, prompts, 10, ["</tool>"], temperature=1.0, seed=5, batch_size=2)
    assert [t.completion_ids for t in sampled] == [t.completion_ids for t in again]     # per-prompt seeds: batching does not matter
    recs = solve(tasks[:5], scripted_modules(tasks, planner=ModelPlanner(model, tok), tokenizer=tok), max_turns=2)
    assert all(len(r.planner_turns) == r.turns and r.planner_turns[0]["completion_ids"] for r in recs)
    assert all(is_tool_error(s) for r in recs for s in r.memory if not s["command"])      # no call made: an error


# ------------------------------------------------------------------ model output is untrusted input (issue 27, item 23)

MiB = 1 << 20
MAX_CPU_S = 5.0            # generous: each parser takes a few ms on 1 MiB; the quadratic regexes they replace took > 45 s
NON_TEXT = (None, 7, 3.5, b"<plan>x</plan><tool>search</tool>", ["STOP"], {"Question: ": 1}, object())


def _hostile_inputs(tasks) -> dict:
    "1 MiB texts shaped against each parser: many starts of a pattern whose end never comes, long runs, a huge memory."
    step = Memory([MemoryStep(i, f"Look up N{i}.", "lookup", f"N{i}", "fact " * 30, "CONTINUE", "more") for i in range(6000)])
    big_memory = flow_prompt(FlowRole.VERIFIER, tasks[0]["question"], step.render(), "STOP or CONTINUE?")
    shapes = {"<plan>": "<plan>" * (MiB // 6), "</plan>": "<plan>" + "</plan>" * (MiB // 7),
              "</plan> + spaces": "<plan></plan>" + " " * MiB, "<plan><tool>": "<plan><tool>" * (MiB // 12),
              "Question: ": "Question: " * (MiB // 10), "Memory:": "\nMemory:\n" * (MiB // 9),
              "Memory: Now:": "\nMemory:\n" + "\nNow: " * (MiB // 6), "Role: ": "Role: " * (MiB // 6),
              "Sub-goal: ": "Sub-goal: " * (MiB // 10), "Step | ": "Step 1 | " * (MiB // 9),
              "step lines": "Step 1 | a | b\n" * (MiB // 15), "step, long verdict": "Step 1 | a | b\ncommand: \"\"\nresult: r\nverdict: " + "x" * MiB,
              "digits": "Step " + "9" * MiB + " | a | b\ncommand: \"\"\nresult: r", "nested command": "Step 1 | a | b\ncommand: " + "[" * MiB + "\nresult: r",
              "STOP + spaces": "STOP" + " " * MiB + "x" * MiB, "spaces": " " * MiB, "a flow prompt with 6000 steps": big_memory}
    assert all(len(t) >= MiB * 0.9 for t in shapes.values())
    return shapes


def test_parsers_linear_time_on_1mib_inputs(tasks):
    "Every parser of model or prompt text finishes a 1 MiB hostile input in well under MAX_CPU_S of CPU time (no quadratic scans)."
    def cpu(f, *a):
        t0 = time.process_time(); out = f(*a)
        return out, time.process_time() - t0
    slow, calls = [], {"parse_decision": parse_decision, "parse_verdict_line": parse_verdict_line, "read_memory": read_memory,
                       "read_flow_prompt": read_flow_prompt, "ScriptedFlow": ScriptedFlow(tasks),
                       "executor_call": lambda t: executor_call(tasks[0], FlowPrompt(FlowRole.EXECUTOR, "", [], t), random.Random(0), FlowKnobs())}
    for shape, text in _hostile_inputs(tasks).items():
        for name, f in calls.items():
            _, s = cpu(f, text)
            if s >= MAX_CPU_S: slow.append((name, shape, round(s, 1)))
    assert not slow, f"calls over {MAX_CPU_S} s of CPU on 1 MiB (quadratic?): {slow}"
    assert len(read_flow_prompt(_hostile_inputs(tasks)["a flow prompt with 6000 steps"]).steps) == 6000


def test_parsers_never_raise_on_non_text(tasks):
    for x in NON_TEXT:
        assert parse_decision(x).tool is None
        assert parse_verdict_line(x) == (Verdict.CONTINUE, "unreadable verdict")
        assert read_memory(x) == []
        assert read_flow_prompt(x) == FlowPrompt(None, "", [], "")
        assert ScriptedFlow(tasks)(x).startswith("<report>")


# the committed regexes: the linear parsers keep their meaning (the first <plan>, up to the first </plan><tool> after it)
_OLD_PLAN_RE = re.compile(r"<plan>(.*?)</plan>\s*<tool>(.*?)(?:</tool>|$)", re.S)
_OLD_Q_RE = re.compile(r"Question: (.*?)\nTools:\n", re.S)
_OLD_MEM_RE = re.compile(r"\nMemory:\n(.*?)\nNow: (.*?)(?:" + re.escape(IM_END) + r"|$)", re.S)
LAYOUT = ["<plan>", "</plan>", "<tool>", "</tool>", " ", "\n", "search", "x", "Question: ", "\nTools:\n", "\nMemory:\n", "\nNow: ",
          IM_END, "Role: executor.", "Role: ", "Step 1 | lookup | x\ncommand: \"c\"\nresult: r", "\nverdict: STOP - ok"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(LAYOUT) | st.text(max_size=5), max_size=25))
def test_linear_parsers_agree_with_the_regexes_they_replace(parts):
    text = "".join(parts)
    m = _OLD_PLAN_RE.search(text)
    d = parse_decision(text)
    assert (d.sub_goal, d.tool) == ((one_line(m.group(1))[:300], parse_tool(m.group(2))) if m else ("", None))
    q, mem, p = _OLD_Q_RE.search(text), _OLD_MEM_RE.search(text), read_flow_prompt(text)
    assert p.question == (q.group(1) if q else "")
    assert p.instruction == (mem.group(2).strip() if mem else "")
    assert p.steps == (read_memory(mem.group(1)) if mem else [])


TEXT = st.lists(st.characters() | st.sampled_from(["\n", " | ", "|", " - ", "\r", "\u2028", "\x85", "Step 1 | ", "\ncommand: "]),
                max_size=20).map("".join)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.builds(MemoryStep, st.integers(-5, 10**6), TEXT, TEXT | st.sampled_from(["rm -rf", "<tool>x y</tool>", " Lookup "]),
                          TEXT, TEXT, st.sampled_from(["", "STOP", "CONTINUE"]), TEXT), max_size=8))
def test_every_memory_step_written_is_read_back(steps):
    "Any step (odd tool labels, newlines and `|` in any field) is read back from the rendered memory, field for field."
    back = read_memory(Memory(steps).render())
    assert back == [MemoryStep(s.turn, one_line(s.sub_goal), tool_label({"tool": s.tool}), s.command, one_line(s.result), s.verdict,
                               one_line(s.reason) if s.verdict else "") for s in steps]


def test_fixed_modules_see_every_step_after_invalid_planner_turns(tasks):
    "Planner turns that name no tool leave steps the verifier and generator still read (it saw 0 of 3 before)."
    seen, strict = [], scripted_modules(tasks, knobs=FlowKnobs(verifier_skip_p=0.0))
    def verifier(prompt):
        seen.append(len(read_flow_prompt(prompt).steps)); return "CONTINUE: more"
    junk = FlowModules(BackendPlanner(ScriptedBackend(lambda p: "<tool>rm -rf /</tool> <plan>x y</plan>")), strict.executor,
                       ScriptedBackend(verifier), strict.generator)
    rec = solve(tasks[:1], junk, max_turns=3)[0]
    assert seen == [1, 2, 3] and [s["tool"] for s in rec.memory] == [INVALID_TOOL] * 3


def test_fixed_module_prompts_are_bounded(tasks):
    "Over 40 turns the executor's, verifier's and generator's view of the memory stays within `module_memory_chars`, as the planner's does."
    task = next(t for t in tasks if t["kind"] == "multihop")
    flow, views = ScriptedFlow([task]), {}
    def recording(prompt):
        p = read_flow_prompt(prompt)
        mem = prompt.split("\nMemory:\n", 1)[1].split("\nNow: ", 1)[0]
        views.setdefault(p.role, []).append(len(mem))
        return "CONTINUE: more" if p.role is FlowRole.VERIFIER else flow(prompt)
    backend = ScriptedBackend(recording)
    turn = lambda p: re.search(r"turn (\d+) of", p).group(1)          # a new query each turn: no "already called" short results
    planner = BackendPlanner(ScriptedBackend(lambda p: f"<plan>Look up {task['question'][:40]} {turn(p)}.</plan><tool>search</tool>"))
    limits = FlowLimits()
    rec = solve([task], FlowModules(planner, backend, backend, backend), max_turns=40, limits=limits)[0]
    assert rec.turns == 40 and len(Memory([MemoryStep(**s) for s in rec.memory]).render()) > 3 * limits.module_memory_chars
    assert set(views) == {FlowRole.EXECUTOR, FlowRole.VERIFIER, FlowRole.GENERATOR}
    assert all(n <= limits.module_memory_chars for v in views.values() for n in v), {r: max(v) for r, v in views.items()}
    assert all(len(t["prompt"]) < len(rec.planner_turns[0]["prompt"]) + limits.memory_chars for t in rec.planner_turns)
