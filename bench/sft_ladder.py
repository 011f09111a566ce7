"""The learnability ladder, on **dev** only: dev accuracy against tokens seen for one SFT recipe (a rung).

A rung trains one fresh student (`--size`) on the run's CoA SFT set restricted to some task kinds, in one or more phases
(a curriculum: `--phase multihop:800000 --phase all:1600000` trains 0.8M tokens on multihop rows, then continues on the
mixture), and evaluates the live model on dev tasks every `--eval-every` tokens (greedy, real tools, the CoA format;
`--n-dev` tasks per kind of the phase, ≥ 50 per point). `--minutes` caps each phase's training time (evaluation time
excluded), so rungs of different speeds compare at equal wall-clock cost; the schedule runs on the larger of steps and
minutes used, so its decay ends inside the cap (`coa_lib.tuning.WallClockBudget`); every point records its training minutes.
At the end `--final-n-dev` tasks per kind are evaluated greedily and, with `--avg-k`, sampled k times at
`--temperature` (avg@k). A rung may start from a pretrained model (`--pretrained smollm2-135m` or any HF path, with
`--tuning top_layers|lora|full`): the SFT rows are re-rendered in its chat template, its learning rate defaults to
its kind's (`coa_lib.tuning.default_lr`). `--base-steps N --base-reading 0.5` starts from the stage's base model
pretrained on quote and reading rows; with `--base-reading-steps M`, N quote steps then M steps with that share of reading
rows (the curriculum); `--base-lr` sets the base's learning rate (a bigger model's copy circuit may need a lower one,
and the rate is in the base's name). The learning rate is constant after warm-up (`--schedule`), so the points of a
curve are comparable. Ablations: `--obs-weight 0.1` (observation tokens trained at 0.1 instead of masked), `--rows N`
(epochs over N rows instead of one pass over fresh ones), `--kind-share multihop=0.3 ...` (each kind's share of a phase's
tokens; every kind of the phase, summing to 1; default: the profile's `kind_shares` over the phase's kinds, `--own-mix`: the
set's own mix, as every rung before `mix_nano_share_5M` trained). `--continues RUNG` goes on from another rung's final model
(a fresh optimizer; the tokens it saw carry over into this curve). The SFT rows are written in the profile's data style
(`TeacherConfig.for_profile(...).style`); `--code-cue`/`--no-code-cue`, `--span-findings`, ... change one switch of it
(a rung in another style: keep it in its own `--run-dir`).

    python bench/sft_ladder.py --run-dir runs/ladder --label mh_nano --phase multihop:1500000 --size nano
    python bench/sft_ladder.py --label mh_nano_more --continues mh_nano --phase multihop:1500000 --size nano
    python bench/sft_ladder.py --label mix_smol_top6 --pretrained smollm2-135m --tuning top_layers --phase all:3000000 --minutes 20
    python bench/sft_ladder.py --plot          # every curve of bench/results/ladder/*.json in one figure (and ladder.md)

Writes bench/results/ladder/<label>.json (the curve, the settings, speed, precision) after every point, so a stopped
rung keeps what it measured. The test split is never touched.
"""
from __future__ import annotations
import argparse, json, os, time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from coa_lib.tuning import Tuning

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "ladder"
LIMITS = OUT.parent / "ladder_limits.json"     # {rung: what limits it}, written by hand after reading its curves


def final_phase(run_dir: Path, label: str) -> Path:
    "A finished rung's final model: its last trained phase directory (run_dir/ladder/<label>/phase<k>; never a `.done` marker)."
    phases = sorted((p for p in (Path(run_dir) / "ladder" / label).glob("phase*") if p.is_dir()), key=lambda p: int(p.name[5:]))
    if not phases: raise SystemExit(f"no trained phase of rung {label!r} under {Path(run_dir) / 'ladder'}")
    return phases[-1]


def episode_args(doc: str, kind: str):
    "The arguments of a script that reads a finished rung's greedy episodes of one `kind` (`rung_episodes`)."
    import argparse
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True, help="the rung's run dir (its dev split and tokenizer)")
    ap.add_argument("--rung", required=True, help="a finished rung: its final model is run_dir/ladder/<rung>/phase<last>")
    ap.add_argument("--n-dev", type=int, default=50, help=f"{kind} dev tasks")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True, help="name of the JSON under bench/results/")
    return ap


def rung_episodes(a, kind: str) -> tuple[Path, Path, dict[str, dict], dict, list[dict]]:
    "A finished rung's greedy episodes on `a.n_dev` dev tasks of `kind`: (run dir, final model, tasks by id, metrics, records)."
    from coa_lib.core import resolve_run_dir
    from coa_lib.evaluate import eval_tasks, evaluate
    from coa_lib.llm import load_policy
    from coa_lib.sft import SFTStageConfig
    from coa_lib.stage_tasks import build_task_splits, student_tokenizer
    from coa_lib.tasks import TaskConfig
    torch.set_num_threads(a.threads)
    rd = resolve_run_dir(a.run_dir)
    model = final_phase(rd, a.rung)
    tasks = {t["id"]: t for t in eval_tasks(build_task_splits(rd, TaskConfig.for_profile("full"))["dev"], a.n_dev, (kind,))}
    metrics, records = evaluate(load_policy(str(model), student_tokenizer(rd, "full")), list(tasks.values()), fmt="coa",
                                progress=False, limits=SFTStageConfig.for_profile("full").limits)
    return rd, model, tasks, metrics, records


def parse_phase(spec: str) -> tuple[tuple[str, ...], int]:
    "'multihop,math:800000' -> (('multihop', 'math'), 800000); 'all' means every kind."
    from coa_lib.core import TASK_KINDS
    kinds, _, tokens = spec.rpartition(":")
    names = TASK_KINDS if kinds == "all" else tuple(kinds.split(","))
    bad = [k for k in names if k not in TASK_KINDS]
    if bad or not tokens.isdigit(): raise SystemExit(f"bad --phase {spec!r}: kinds from {TASK_KINDS} or 'all', then :tokens")
    return tuple(names), int(tokens)


def parse_shares(specs: list[str] | None) -> dict[str, float]:
    "['multihop=0.3', 'math=0.06', ...] -> {'multihop': 0.3, 'math': 0.06, ...} (checked by `SFTStageConfig` as a phase's kind shares)."
    out = {}
    for spec in specs or []:
        kind, _, share = spec.partition("=")
        try: out[kind] = float(share)
        except ValueError: raise SystemExit(f"bad --kind-share {spec!r}: kind=share, e.g. multihop=0.3")
    return out


def phase_shares(kinds: tuple[str, ...], given: dict[str, float], profile: dict[str, float] | None, own_mix: bool) -> dict[str, float] | None:
    "A phase's kind shares: `--kind-share` as given, else the profile's over the phase's kinds (renormalised); None: the set's own mix."
    if own_mix: return None
    if given or not profile: return given or None
    total = sum(profile.get(k, 0.0) for k in kinds)
    return {k: profile[k] / total for k in kinds if profile.get(k)} if total else None


STYLE_FLAGS = ("span_findings", "compare_by_code", "compare_cue", "code_cue", "restate_question", "restate_plan_line",
               "next_step_cue", "plan_phrases")   # DataStyle's switches, each a --flag / --no-flag


def teacher_config(a):
    "The profile's teacher, its data style changed where a flag was given (its own checks refuse a style without the one it builds on)."
    from coa_lib.mas import TeacherConfig
    profile = TeacherConfig.for_profile(a.profile)
    given = {f: getattr(a, f) for f in STYLE_FLAGS if getattr(a, f) is not None}
    if a.sentence_kind is not None: given["sentence_kinds"] = tuple(a.sentence_kind)
    return replace(profile, style=replace(profile.style, **given))


def ladder_run(rd: Path, a):
    "The run whose SFT sets a rung trains on: the profile's, with the teacher's data styles asked for (another data set: keep it in its own run dir)."
    from coa_lib.run import Run
    return Run(rd, a.profile, teacher=teacher_config(a))


def rung_config(a):
    "A rung's SFT settings: the profile's, with what the rung's arguments set (its base's phases included: the ladder's bases are its own)."
    from coa_lib.sft import SFTStageConfig
    return replace(SFTStageConfig.for_profile(a.profile), size=a.size, lr=a.lr, batch_size=a.batch, max_len=a.max_len,
                   base=a.pretrained, tuning=a.tuning, train_layers=a.train_layers, lora_r=a.lora_r, eval_dtype=a.eval_dtype,
                   base_reading=a.base_reading, base_reading_steps=a.base_reading_steps, base_compare=a.base_compare,
                   **({"base_lr": a.base_lr} if a.base_lr is not None else {}),
                   warmup_steps=a.warmup, lr_schedule=a.schedule, threads=a.threads, save_steps=10**9,
                   logging_steps=10, obs_weight=a.obs_weight, seed=a.seed, lanes=1,
                   bf16=None if a.bf16 == "auto" else a.bf16 == "on", average_from=a.average_from, keep_last_iterate=a.keep_last)


def run_rung(a) -> dict:
    from transformers import TrainerCallback
    from coa_lib.core import atomic_write_json, built_record, resolve_run_dir
    from coa_lib.stage_filter import build_sft_sets
    from coa_lib.llm import build_tiny_qwen2, load_policy
    from coa_lib.stage_tasks import student_tokenizer
    from coa_lib.evaluate import evaluate
    from coa_lib.evaluate import eval_tasks
    from coa_lib.sft import copy_token_losses, train_sft
    from coa_lib.stage_sft import held_out_dev_rows
    from coa_lib.stage_tasks import build_task_splits
    from coa_lib.stage_sft import rows_for_tokenizer
    from coa_lib.tasks import TaskConfig
    from coa_lib.tuning import WallClockBudget
    from coa_lib.pretrained import resolve_base
    from coa_lib.tokenizer import load_tokenizer

    torch.set_num_threads(a.threads)
    rd = resolve_run_dir(a.run_dir)
    rows = build_sft_sets(ladder_run(rd, a), a.profile, progress=False)["coa_sft"]
    tok = student_tokenizer(rd, a.profile)
    if a.pretrained:          # a pretrained model: its own tokenizer, the rows' prompts in its chat template
        a.base = resolve_base(a.pretrained)
        tok = load_tokenizer(a.base)
        rows = rows_for_tokenizer(rows, tok)
    dev_split = build_task_splits(rd, TaskConfig.for_profile(a.profile))["dev"]
    phases = [parse_phase(p) for p in a.phase]
    shares = parse_shares(a.kind_share)
    if shares and a.own_mix: raise SystemExit("--kind-share and --own-mix exclude each other")
    cfg = rung_config(a)
    res = {"label": a.label, "size": a.size, "base": a.base, "phases": [{"kinds": list(k), "tokens": t} for k, t in phases],
           "rows_cap": a.rows, "obs_weight": a.obs_weight, "config": asdict(cfg), "n_dev_per_kind": a.n_dev,
           "learning_rate": cfg.learning_rate, "minutes_cap": a.minutes, "pretrained": a.pretrained, **asdict(teacher_config(a).style),
           "load_avg_before": os.getloadavg()[0], "curve": [], "phases_done": []}
    out_json = OUT / f"{a.label}.json"
    base, offset = None, 0
    if a.continues:           # go on training another rung's final model; its tokens count towards this curve
        prev = json.loads((OUT / f"{a.continues}.json").read_text())
        if not prev.get("phases_done"): raise SystemExit(f"rung {a.continues!r} has no finished phase to continue")
        a.base = str(rd / "ladder" / a.continues / f"phase{len(prev['phases_done']) - 1}")
        offset = prev["curve"][-1]["tokens_seen"]
        res.update(base=a.base, continues=a.continues, offset_tokens=offset)
    held_out = held_out_dev_rows(ladder_run(rd, a), a.profile, tuple(k for ks, _ in phases for k in ks), 40)   # rows in the rung's data style

    class DevCurve(TrainerCallback):
        "Dev accuracy of the live model each time another `eval_every` tokens have been seen."
        def __init__(self, dev: list[dict], budget): self.dev, self.next, self.budget = dev, a.eval_every, budget
        def on_step_end(self, args, state, control, model=None, **kw):
            seen = offset + int(state.num_input_tokens_seen)
            if seen < self.next: return
            self.next = seen + a.eval_every
            t0 = time.perf_counter()
            point(model, seen, state, self.dev, minutes_offset + self.budget.elapsed() / 60)
            self.budget.exclude(time.perf_counter() - t0)          # evaluation is not training time

    def point(model, seen, state, dev, train_minutes, into: dict | None = None, path: Path | None = None):
        t0 = time.perf_counter(); model.eval()
        try:
            import copy                                              # with an eval dtype, a copy: the trained weights stay fp32
            policy = load_policy(model if cfg.eval_dtype is None else copy.deepcopy(model), tok, dtype=cfg.eval_dtype)
            m, _ = evaluate(policy, dev, fmt="coa", progress=False, limits=cfg.limits)
        finally: model.train()
        loss = next((h["loss"] for h in reversed(state.log_history) if "loss" in h), None) if state else None
        p = {"tokens_seen": seen, "train_minutes": train_minutes, "loss": loss, "dev_tasks": len(dev), "dev_accuracy": m["accuracy"],
             "by_kind": {k: v["accuracy"] for k, v in m["by_kind"].items()}, "invalid_rate": m["invalid_rate"],
             "finish": m["finish_reasons"], "eval_s": time.perf_counter() - t0, "wall_s": time.perf_counter() - t_start}
        if held_out: p["token_losses"] = copy_token_losses(model, tok, held_out)
        (res if into is None else into)["curve"].append(p)
        print(f"[{a.label}] {seen:>9,} tokens  loss {loss if loss is None else round(loss, 3)}  dev {m['accuracy']:.3f} "
              f"(invalid {m['invalid_rate']:.2f}) " + " ".join(f"{k[:5]} {v:.2f}" for k, v in p["by_kind"].items())
              + "  nll " + " ".join(f"{k} {v:.2f}" for k, v in p.get("token_losses", {}).items()), flush=True)
        atomic_write_json(out_json if path is None else path, res if into is None else into)

    per_kind = lambda kinds: max(a.n_dev, -(-a.min_dev // len(kinds)))      # at least `min_dev` dev tasks per point
    t_start, minutes_offset = time.perf_counter(), 0.0
    for i, (kinds, tokens) in enumerate(phases):
        subset = rows.filter(lambda r: r["kind"] in kinds)
        if a.rows: subset = subset.shuffle(seed=a.seed).select(range(min(a.rows, subset.num_rows)))
        dev = eval_tasks(dev_split, per_kind(kinds), kinds)
        pcfg = replace(cfg, token_budget=tokens, seed=a.seed + i, kind_shares=phase_shares(kinds, shares, cfg.kind_shares, a.own_mix))
        res["phases"][i]["kind_shares"] = pcfg.kind_shares
        if base is None and (a.base or a.base_steps):
            from transformers import AutoModelForCausalLM
            if a.base_steps: a.base = res["base"] = str(ladder_base(rd, cfg, a))
            base = AutoModelForCausalLM.from_pretrained(a.base)
        model = build_tiny_qwen2(tok, a.size, seed=a.seed) if base is None else base
        out = rd / "ladder" / a.label / f"phase{i}"
        t0 = time.perf_counter()
        budget = WallClockBudget(a.minutes or 1e9)
        path = train_sft(subset, model, out, pcfg, tokenizer=tok, callbacks=[DevCurve(dev, budget), budget])
        minutes_offset += budget.elapsed() / 60
        done = built_record(path)
        res["phases_done"].append({"kinds": list(kinds), "rows_available": subset.num_rows, "tokens_seen": done["tokens_seen"],
                                   "steps": done["global_step"], "train_wall_s": done["wall_s"],
                                   "tokens_per_s": done["tokens_seen"] / done["wall_s"], "precision": done["precision"],
                                   "phase_wall_s": time.perf_counter() - t0, "train_minutes": budget.elapsed() / 60,
                                   "stopped_by_minutes": budget.stopped_at_step is not None})
        offset += done["tokens_seen"]
        from transformers import AutoModelForCausalLM
        base = AutoModelForCausalLM.from_pretrained(str(path))
        if not res["curve"] or res["curve"][-1]["tokens_seen"] < offset: point(base, offset, None, dev, minutes_offset)
    if a.final_n_dev:          # the rung's result: every kind, greedy and avg@k, with 95% intervals
        res["final"] = final_eval(base, tok, cfg, eval_tasks(dev_split, a.final_n_dev), a)
        atomic_write_json(out_json, res)
        if a.keep_last: last_iterate_rung(res, out, dev, offset, minutes_offset, point, lambda m: final_eval(m, tok, cfg, eval_tasks(dev_split, a.final_n_dev), a))
    res["wall_s"] = time.perf_counter() - t_start
    res["load_avg_after"] = os.getloadavg()[0]
    atomic_write_json(out_json, res)
    return res


def ladder_base(rd: Path, cfg, a) -> Path:
    "The stage's base model at `a.size` (quote rows, then reading rows with `--base-reading`), built once per size, steps, mix and seed."
    from coa_lib.stage_sft import pretrain_base
    base_seed = a.seed if a.base_seed is None else a.base_seed
    seeded = f"_seed{base_seed}" if base_seed else ""          # seed 0: the names every earlier rung used
    rate = f"_lr{a.base_lr:g}" if a.base_lr is not None else ""   # the profile's base rate: the names every earlier rung used
    quote = rd / "ladder" / f"base_quote_{a.size}_{a.base_steps}{rate}{seeded}"
    compare = f"_cmp{a.base_compare:g}" if a.base_compare else ""
    name = (f"{quote.name}_reading{a.base_reading:g}x{a.base_reading_steps}{compare}" if a.base_reading_steps else
            f"base_reading{a.base_reading:g}{compare}_{a.size}_{a.base_steps}{rate}{seeded}" if a.base_reading else quote.name)
    return pretrain_base(rd, replace(cfg, base_steps=a.base_steps, base_reading_steps=a.base_reading_steps, base_threads=a.threads, seed=base_seed),
                         rd / "ladder" / name, quote_dir=quote)


def reevaluate(a) -> dict:
    "The final evaluation of rung `a.reevaluate` again (its saved final model, today's SFTStageConfig turn budget), into its JSON."
    from transformers import AutoModelForCausalLM
    from coa_lib.core import atomic_write_json, resolve_run_dir
    from coa_lib.evaluate import eval_tasks
    from coa_lib.sft import SFTStageConfig
    from coa_lib.stage_tasks import build_task_splits, student_tokenizer
    from coa_lib.tasks import TaskConfig
    from coa_lib.tokenizer import load_tokenizer
    torch.set_num_threads(a.threads)
    out_json = OUT / f"{a.reevaluate}.json"
    if not out_json.is_file(): raise SystemExit(f"no rung {a.reevaluate!r}: rungs are {sorted(p.stem for p in OUT.glob('*.json'))}")
    res = json.loads(out_json.read_text())
    if not res.get("phases_done"): raise SystemExit(f"rung {a.reevaluate!r} has no finished phase")
    rd = resolve_run_dir(a.run_dir)
    path = rd / "ladder" / a.reevaluate / f"phase{len(res['phases_done']) - 1}"
    if not path.is_dir(): raise SystemExit(f"no final model of {a.reevaluate!r} at {path} (is --run-dir the rung's?)")
    tok = load_tokenizer(path) if res.get("pretrained") else student_tokenizer(rd, a.profile)
    cfg = replace(SFTStageConfig(**{**res["config"], "tuning": res["config"].get("tuning", "full")}),
                  max_new_tokens=SFTStageConfig().max_new_tokens)
    dev = eval_tasks(build_task_splits(rd, TaskConfig.for_profile(a.profile))["dev"], a.final_n_dev)
    a.label, a.seed = a.reevaluate, res["config"].get("seed", 0)
    new = final_eval(AutoModelForCausalLM.from_pretrained(str(path)), tok, cfg, dev, a)
    new["max_new_tokens"] = cfg.max_new_tokens
    if "final" in res: res["final_before"] = {**res["final"], "max_new_tokens": res["final"].get("max_new_tokens", res["config"]["max_new_tokens"])}
    res["final"] = new
    atomic_write_json(out_json, res)
    return res


def last_iterate_rung(res: dict, out: Path, dev: list[dict], seen: int, minutes: float, point, final) -> dict:
    "The rung's own run at its last step (before tail averaging), as a rung of its own, `<label>_last`, for paired comparisons."
    from transformers import AutoModelForCausalLM
    if not (out / "last_iterate").is_dir(): raise SystemExit(f"no last iterate at {out / 'last_iterate'}: no step was averaged")
    model = AutoModelForCausalLM.from_pretrained(str(out / "last_iterate"))
    twin = {**{k: v for k, v in res.items() if k not in ("curve", "final")}, "label": f"{res['label']}_last", "last_iterate_of": res["label"],
            "curve": res["curve"][:-1]}                       # the live model's points are the same run's
    point(model, seen, None, dev, minutes, into=twin, path=OUT / f"{twin['label']}.json")
    twin["final"] = final(model)
    from coa_lib.core import atomic_write_json
    atomic_write_json(OUT / f"{twin['label']}.json", twin)
    return twin


def final_eval(model, tok, cfg, dev: list[dict], a) -> dict:
    "Greedy accuracy and avg@k (sampled at `a.temperature`) of the final model on `dev`, overall and by kind, with 95% CIs."
    from coa_lib.evaluate import evaluate
    from coa_lib.llm import load_policy
    policy = load_policy(model, tok, dtype=cfg.eval_dtype)
    out = {}
    t0 = time.perf_counter()
    g, recs = evaluate(policy, dev, fmt="coa", progress=False, limits=cfg.limits)
    out["greedy"] = {k: g[k] for k in ("n_tasks", "accuracy", "accuracy_ci95", "by_kind", "invalid_rate", "finish_reasons",
                                        "mean_processed_tokens", "mean_tool_calls")}
    out["greedy"]["reward_by_task"] = dict(zip(recs["task_id"], recs["reward"]))    # for paired comparisons between rungs
    out["greedy"]["eval_s"] = time.perf_counter() - t0
    print(f"[{a.label}] final greedy on {len(dev)} dev tasks: {g['accuracy']:.3f} {g['accuracy_ci95']} "
          + " ".join(f"{k[:5]} {v['accuracy']:.2f}" for k, v in g["by_kind"].items()), flush=True)
    if a.avg_k:
        t0 = time.perf_counter()
        s, _ = evaluate(policy, dev, fmt="coa", n=a.avg_k, k=(1,), temperature=a.temperature, seed=a.seed, progress=False, limits=cfg.limits)
        out[f"avg@{a.avg_k}"] = {"temperature": a.temperature, "accuracy": s["avg@1"], "accuracy_ci95": s["accuracy_ci95"],
                                 f"pass@1": s["pass@1"], "by_kind": {k: v["accuracy"] for k, v in s["by_kind"].items()},
                                 "invalid_rate": s["invalid_rate"], "eval_s": time.perf_counter() - t0}
        print(f"[{a.label}] avg@{a.avg_k} (T={a.temperature}): {s['avg@1']:.3f}", flush=True)
    return out


RECIPE_RUNGS = ("mix_nano_planline_5M", "mix_nano_planline_5M_s1")   # the full profile's recipe (plan lines, code cue, tail averaging, the reading base), drawn bold and named
FAMILY_COLORS = {"nano": "tab:blue", "tiny": "tab:orange", "small": "tab:red", "smollm2-135m": "tab:green"}


def rung_family(r: dict) -> str:
    "What a rung trains: its pretrained model or its from-scratch size."
    return r.get("pretrained") or r["size"]


def plot(paths: list[Path], out: Path, named: tuple[str, ...] = RECIPE_RUNGS) -> None:
    "Dev accuracy against training minutes on this machine and against tokens seen, and the held-out copy loss; one line per rung, a colour per family, the recipe's rungs bold and named."
    import matplotlib; matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    fig, (tx, ax, bx) = plt.subplots(1, 3, figsize=(18, 5.5))
    families: dict[str, str] = {}
    drawn = 0
    for p in paths:
        r = json.loads(p.read_text())
        if not r["curve"]: continue
        drawn += 1
        fam = rung_family(r)
        color = families.setdefault(fam, FAMILY_COLORS.get(fam, f"C{len(families) + 4}"))
        bold = r["label"] in named
        style = dict(color=color, marker="o", markersize=3 if bold else 2, linewidth=2.2 if bold else 0.8, alpha=1.0 if bold else 0.45,
                     zorder=3 if bold else 2, linestyle=(0, (4, 1)) if r["label"].startswith("mh_") else "-")
        label = "the recipe" if bold else None
        xs = [c["tokens_seen"] / 1e6 for c in r["curve"]]
        ax.plot(xs, [c["dev_accuracy"] for c in r["curve"]], label=label, **style)
        timed = [(c["train_minutes"], c["dev_accuracy"]) for c in r["curve"] if c.get("train_minutes") is not None]
        if timed: tx.plot(*zip(*timed), label=label, **style)
        elif r.get("phases_done"):    # rungs from before minutes were recorded: minutes estimated from the rung's mean speed (dotted)
            speed = sum(ph["tokens_seen"] for ph in r["phases_done"]) / sum(ph["train_wall_s"] for ph in r["phases_done"])
            start = r.get("offset_tokens", 0)
            tx.plot([(c["tokens_seen"] - start) / speed / 60 for c in r["curve"]], [c["dev_accuracy"] for c in r["curve"]],
                    **{**style, "linestyle": ":", "markersize": 1.5, "alpha": 0.35})
        fin = (r.get("final") or {}).get("greedy")
        if fin and timed: tx.errorbar([timed[-1][0]], [fin["accuracy"]], yerr=[[fin["accuracy"] - fin["accuracy_ci95"][0]], [fin["accuracy_ci95"][1] - fin["accuracy"]]],
                                      fmt="s", color=color, capsize=3, markersize=5 if bold else 3.5, alpha=1.0 if bold else 0.6, zorder=style["zorder"])
        pts = [(x, c["token_losses"]["copied_rest"]) for x, c in zip(xs, r["curve"]) if "copied_rest" in c.get("token_losses", {})]
        if pts: bx.plot(*zip(*pts), **style)
    tx.set(xlabel="training minutes, 2 CPU cores (dotted: estimated for older rungs)", ylabel="dev accuracy",
           title="Ladder by wall clock (squares: final eval, 50/kind, 95% CI)", ylim=(-0.02, 1.02))
    ax.set(xlabel="tokens seen (millions; prompt and observations included)", ylabel="dev accuracy",
           title="Learnability ladder (dev split, greedy, real tools)", ylim=(-0.02, 1.02))
    bx.set(xlabel="tokens seen (millions)", ylabel="nats per token", ylim=(0, None),
           title="Loss on copied tokens of held-out dev trajectories\n(after a span's first)")
    for x in (tx, ax, bx): x.grid(alpha=0.3)
    keys = [Line2D([], [], color=c, linewidth=2, label=f) for f, c in families.items()]
    keys.append(Line2D([], [], color="grey", linestyle=(0, (4, 1)), label="multihop only (mh_*)"))
    keys.append(Line2D([], [], color="grey", linewidth=2.2, marker="o", markersize=3, label="the full profile's recipe: " + ", ".join(named)))
    fig.legend(handles=keys, loc="lower center", ncol=len(keys), fontsize=8, frameon=False,
               title=f"{drawn} rungs, a colour per family (every rung by name and result: ladder.md)", title_fontsize=8)
    fig.tight_layout(rect=(0, 0.1, 1, 1)); fig.savefig(out, dpi=110); plt.close(fig)
    print(f"wrote {out}")


def positive(text: str) -> float:
    "An argument that must be a number above zero (a learning rate)."
    value = float(text)
    if not value > 0: raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    "The ladder's arguments."
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", default="runs/ladder", help="a run dir with (or to build) the SFT sets at --profile")
    ap.add_argument("--profile", default="full")
    ap.add_argument("--label", help="the rung's name (its JSON file)")
    ap.add_argument("--phase", action="append", default=[], help="KINDS:TOKENS, repeatable (a curriculum); KINDS = all | k1,k2")
    ap.add_argument("--size", default="nano")
    ap.add_argument("--lr", type=float, default=None, help="default: the base kind's (coa_lib.tuning.default_lr)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--schedule", default="constant_with_warmup",
                    help="a transformers scheduler name; the default keeps a curve's points comparable, 'linear' or 'cosine' anneal to 0 by the end of each phase")
    ap.add_argument("--obs-weight", type=float, default=0.0)
    ap.add_argument("--rows", type=int, default=0, help="train on at most this many rows (epochs over a smaller set)")
    ap.add_argument("--bf16", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--eval-every", type=int, default=300_000)
    ap.add_argument("--n-dev", type=int, default=10, help="dev tasks per kind of the phase (at least --min-dev in all)")
    ap.add_argument("--min-dev", type=int, default=50, help="dev tasks per evaluation point, at least")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--base-seed", type=int, default=None, help="the base model's seed (default: --seed): another SFT seed from the same base")
    ap.add_argument("--base", default=None, help="start from this saved model (e.g. a pretrained one) instead of a fresh --size model")
    ap.add_argument("--base-steps", type=int, default=0, help="start from the stage's base model (coa_lib.stage_sft.pretrain_base) with these quote steps")
    ap.add_argument("--continues", default=None, help="go on training this rung's final model (its tokens seen carry over)")
    ap.add_argument("--minutes", type=float, default=None, help="cap each phase's training at this many minutes (evaluation excluded); the schedule decays within the cap")
    ap.add_argument("--pretrained", default=None, help="start from a pretrained model: a coa_lib.pretrained.WHEEL_MODELS name or an HF path")
    ap.add_argument("--tuning", default="full", choices=[t.value for t in Tuning])
    ap.add_argument("--train-layers", type=int, default=6)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--eval-dtype", default=None, help="e.g. bfloat16: evaluate a bf16 copy (a big model twice as fast)")
    ap.add_argument("--base-reading", type=float, default=0.0, help="with --base-steps: share of reading rows in the base's pretraining")
    ap.add_argument("--base-reading-steps", type=int, default=0,
                    help="with --base-steps and --base-reading: a curriculum, the quote base then these steps with that share of reading rows")
    ap.add_argument("--base-lr", type=positive, default=None,
                    help="with --base-steps: the base pretraining's learning rate (default: the profile's base_lr); in the base's name")
    ap.add_argument("--base-compare", type=float, default=0.0,
                    help="with --base-reading: share of the reading rows that are comparison rows (two entities' values, the name asked for)")
    ap.add_argument("--average-from", type=float, default=None,
                    help="the rung's model is the mean of its weights after this share of each phase (coa_lib.tuning.TailAverage)")
    ap.add_argument("--keep-last", action="store_true",
                    help="with --average-from: also evaluate the last step's weights, as the rung <label>_last (the same run, not averaged)")
    ap.add_argument("--final-n-dev", type=int, default=50, help="dev tasks per kind (all six kinds) in the final evaluation; 0: none")
    ap.add_argument("--avg-k", type=int, default=4, help="samples per task for the final avg@k (0: greedy only)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--kind-share", action="append", metavar="KIND=SHARE",
                    help="each kind's share of a phase's tokens (every kind of the phase, summing to 1), instead of the set's own mix")
    ap.add_argument("--own-mix", action="store_true", help="train on the SFT set's own mix of kinds (the rungs before kind shares)")
    ap.add_argument("--span-findings", action=argparse.BooleanOptionalAction, default=None,
                    help="SFT rows from the teacher's span findings ('Page, span.', coa_lib.teacher.finding) instead of the page's sentences")
    ap.add_argument("--compare-by-code", action=argparse.BooleanOptionalAction, default=None,
                    help="SFT rows whose comparisons end with a code step comparing the findings (coa_lib.teacher.plan_steps)")
    ap.add_argument("--compare-cue", action=argparse.BooleanOptionalAction, default=None,
                    help="with --compare-by-code: the program prints its answer after its own words (coa_lib.teacher.comparison_code)")
    ap.add_argument("--code-cue", action=argparse.BooleanOptionalAction, default=None,
                    help="SFT rows whose code programs read their integer parameters from the question's words (coa_lib.problems.cued_solution)")
    ap.add_argument("--restate-question", action=argparse.BooleanOptionalAction, default=None,
                    help="SFT rows whose findings open with the step's question about the page (coa_lib.teacher.search_policy)")
    ap.add_argument("--restate-plan-line", action=argparse.BooleanOptionalAction, default=None,
                    help="SFT rows whose findings open with the step's line of the plan (coa_lib.teacher.search_policy)")
    ap.add_argument("--next-step-cue", action=argparse.BooleanOptionalAction, default=None,
                    help="SFT rows whose findings end with the plan's next line or 'Next: the answer.' (coa_lib.teacher.next_step_cue)")
    ap.add_argument("--plan-phrases", action=argparse.BooleanOptionalAction, default=None,
                    help="SFT rows whose multihop plan lookups end with the question's words for what they find (coa_lib.teacher.found_phrases)")
    ap.add_argument("--sentence-kind", action="append", default=None, metavar="KIND",
                    help="with --span-findings: this kind's findings stay the page's sentences (repeatable)")
    ap.add_argument("--base-only", action="store_true", help="with --base-steps: only build the base of --size (quote, and reading with --base-reading)")
    ap.add_argument("--plot", action="store_true", help="only plot the saved curves")
    ap.add_argument("--reevaluate", metavar="RUNG", default=None,
                    help="evaluate a finished rung's final model again with today's evaluation settings (e.g. a new turn budget); "
                         "the old result is kept as final_before")
    return ap


def main():
    ap = build_parser()
    a = ap.parse_args()
    try: teacher_config(a)
    except ValueError as e: ap.error(f"the data-style flags: {e}")
    if a.keep_last and a.average_from is None: ap.error("--keep-last evaluates the last weights beside the averaged ones: give --average-from")
    try: rung_config(a)
    except ValueError as e: ap.error(f"the training flags: {e}")
    if a.base_only:               # build the size's base ahead of its rungs (they find it built); no SFT sets, no plot
        if not a.base_steps: raise SystemExit("--base-only builds the base of --base-steps steps: give them")
        from coa_lib.core import resolve_run_dir
        torch.set_num_threads(a.threads)
        print(f"base: {ladder_base(resolve_run_dir(a.run_dir), rung_config(a), a)}")
        return
    OUT.mkdir(parents=True, exist_ok=True)
    if a.reevaluate: reevaluate(a)
    elif not a.plot:
        if not a.label or not a.phase: raise SystemExit("--label and at least one --phase are needed")
        run_rung(a)
    plot(sorted(OUT.glob("*.json")), OUT / "ladder.png")
    write_table(OUT, OUT / "ladder.md")


def write_table(results_dir: Path, out: Path) -> None:
    "Every rung as one row of a markdown table (`coa_lib.sft.ladder_summary`), next to the plot."
    from coa_lib.core import atomic_write_text
    from coa_lib.sft import ladder_summary
    df = ladder_summary(results_dir).reset_index()
    limits = json.loads(LIMITS.read_text())["limits"] if LIMITS.exists() else {}
    df["limit"] = [limits.get(r, "") for r in df["rung"]]          # what limits each rung, written from its curves
    fmt = lambda v: "" if v is None or v != v else f"{v:.3g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    atomic_write_text(out, "Every rung of `bench/sft_ladder.py` (dev split only; written by `--plot`; the `limit` column is "
                      "`bench/results/ladder_limits.json`, what its curves say limits it).\n\n" + "\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
