"""The tutorial site (`make docs`): every real notebook gets a page, a run's executed copy and report show, links resolve;
pages show no nbdev plumbing, machine path or set-up warning; and the run's figures read cleanly."""
import json, re, shutil, tempfile, time
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import nbformat
import pytest

from coa_lib.docs import build_docs, check_site

REPO = Path(__file__).resolve().parents[1]
NBS = REPO / "nbs"
STAGE = "00_format"                       # the stage notebook the fake run has "executed"
MARK = "OUTPUT-OF-THE-FULL-RUN-0f3a"      # what papermill would have left in its first code cell
BAR = "teacher (x): 100%|██████████| 4/4 [00:01<00:00, 3.9it/s]"   # a tqdm widget's last state, as text
TQDM_WARNING = ("{venv}/lib/python3.11/site-packages/tqdm/auto.py:21: TqdmWarning: IProgress not found. Please update jupyter "
                "and ipywidgets. See https://ipywidgets.readthedocs.io/en/stable/user_install.html\n"
                "  from .autonotebook import tqdm as notebook_tqdm\n")


def _png(path: Path, title: str) -> Path:
    "A small matplotlib figure saved as PNG."
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1, 2], [3, 1, 2]); ax.set_title(title)
    fig.savefig(path); plt.close(fig)
    return path


def _executed_copy(run: Path) -> None:
    "`STAGE` as papermill leaves it: its injected-parameters cell (this machine's run dir), outputs with a tqdm widget and warning."
    nb = nbformat.read(NBS / f"{STAGE}.ipynb", as_version=4)
    i, cell = next((i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code" and "default_exp" not in c.source)
    new = nbformat.v4.new_output
    cell.outputs = [new("stream", name="stderr", text=TQDM_WARNING.format(venv=REPO / ".venv")),
                    new("stream", name="stdout", text=f"{MARK}\nwrote {run}/x.json\n"),
                    new("display_data", data={"application/vnd.jupyter.widget-view+json": {"model_id": "box", "version_major": 2},
                                              "text/plain": "teacher (x):   0%|          | 0/4"})]
    nb.cells.insert(i, nbformat.v4.new_code_cell(f'# Parameters\nprofile = "smoke"\nrun_dir = "{run}"\n',
                                                 metadata={"tags": ["injected-parameters"]}))
    state = {"box": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_l", "IPY_MODEL_b", "IPY_MODEL_r"]}},
             "l": {"model_name": "HTMLModel", "state": {"value": "teacher\u2007(x):\u2007100%"}},
             "b": {"model_name": "FloatProgressModel", "state": {"value": 4.0, "max": 4.0}},
             "r": {"model_name": "HTMLModel", "state": {"value": "\u20074/4\u2007[00:01&lt;00:00,\u20073.9it/s]"}}}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": state, "version_major": 2, "version_minor": 0}}
    nb.metadata["papermill"] = {"input_path": str(NBS / f"{STAGE}.ipynb"), "output_path": str(run / "notebooks" / f"{STAGE}.ipynb")}
    nbformat.write(nb, run / "notebooks" / f"{STAGE}.ipynb")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    "The site of the real nbs/ and README against a fake run dir: one executed stage notebook, report.md with figures."
    tmp = tmp_path_factory.mktemp("docs")
    run = tmp / "run"
    (run / "notebooks").mkdir(parents=True)
    _executed_copy(run)
    (run / ".done").mkdir()
    (run / ".done" / f"{STAGE}.json").write_text(json.dumps({"notebook": f"{STAGE}.ipynb", "profile": "smoke"}))
    _png(run / "figures" / "sft_loss.png", "loss")
    _png(run / "rl" / "curve.png", "curve")     # a figure outside figures/, linked by the report
    (run / "report.md").write_text("# Report\n\n| system | accuracy |\n|---|---:|\n| coa | 24.0 |\n\n"
                                   "![SFT loss](figures/sft_loss.png)\n\n![RL curve](rl/curve.png)\n")
    t0 = time.time()
    # a cache kept between runs (git-ignored build/): mkdocs-jupyter renders only the notebooks that changed (cold: ~50 s);
    # the companions are not executed here (test_companion_notebooks_are_executed_for_their_pages does that on a tiny checkout)
    site = build_docs(run, tmp / "site", repo_root=REPO, build_dir=tmp / "build", cache_dir=REPO / "build" / "docs_test_cache",
                      companions=False)
    print(f"full site built in {time.time() - t0:.1f} s")
    return site, tmp


def _text(page_html: str, keep_code: bool = True) -> str:
    "A page's text: tags dropped (and with them, unless `keep_code`, code: <pre>, <code> and a copy button's hidden text)."
    if not keep_code:
        page_html = re.sub(r"<(pre|code)\b.*?</\1>|<div class=\"clipboard-copy-txt\"[^>]*>.*?</div>", "", page_html, flags=re.S)
    return re.sub(r"<[^>]+>", "", page_html)


@pytest.mark.timeout(600)
def test_site_is_complete_and_links_resolve(built):
    site, tmp = built
    from coa_lib.docs import MachinePaths
    assert check_site(site, NBS, MachinePaths.of(REPO, tmp / "run")) == []   # links, anchors, tables, directives, machine paths
    pages = sorted(p.stem for p in (site / "notebooks").glob("*.html"))
    assert pages == sorted(p.stem for p in NBS.glob("*.ipynb"))


def test_executed_copy_report_and_figures(built):
    site, _ = built
    stage = (site / "notebooks" / f"{STAGE}.html").read_text()
    assert MARK in stage and "Shown without outputs" not in stage
    others = [p for p in sorted(NBS.glob("*.ipynb")) if p.stem != STAGE]
    assert all("Shown without outputs" in (site / "notebooks" / f"{p.stem}.html").read_text() for p in others)
    report = (site / "report.html").read_text()
    assert "sft_loss.png" in report and "curve.png" in report
    assert (site / "figures" / "sft_loss.png").is_file() and (site / "rl" / "curve.png").is_file()
    assert (site / "run_figures.html").is_file() and (site / "notebooks" / f"{STAGE}.ipynb").is_file()   # + the download


def test_pages_show_no_nbdev_plumbing_or_machine_path(built):
    "Issue 27 item 6: no `#| ` directive, hidden cell or injected-parameters cell; no path of this machine, HTML or download."
    site, tmp = built
    for page in sorted(site.rglob("*.html")):
        text = _text(page.read_text())
        assert not re.search(r"^\s*#\s*\|\s*[\w-]+", text, re.M), f"{page.name}: an nbdev directive shown"
        for path in (str(REPO), str(tmp)):   # (home and /tmp as such are named by the sandbox's own text: check_site sees to them)
            assert not re.search(rf"{re.escape(path)}(?![\w.-])", text), f"{page.name}: shows {path}"
    stage = (site / "notebooks" / f"{STAGE}.html").read_text()
    assert "# Parameters" not in stage and "from fastcore.test import" not in stage       # papermill's cell, a `#| hide` cell
    download = (site / "notebooks" / f"{STAGE}.ipynb").read_text()
    assert str(tmp) not in download and str(REPO) not in download and "injected-parameters" not in download
    assert "wrote runs/" not in download and "wrote $RUN_DIR/x.json" in download            # the run dir, said without its place


def test_progress_bars_and_warnings(built):
    "Issue 27 item 7: notebook progress bars work (ipywidgets, pinned); a page shows a bar's last state, never tqdm's warning."
    from tqdm.notebook import IProgress
    assert IProgress is not None                                   # tqdm.auto in a kernel picks the widget bar
    for f in ("requirements.txt", "constraints.txt"):
        assert re.search(r"^ipywidgets==[\d.]+", (REPO / f).read_text(), re.M), f"{f} pins no ipywidgets"
    site, _ = built
    stage = (site / "notebooks" / f"{STAGE}.html").read_text()
    assert "TqdmWarning" not in stage and "IProgress" not in stage
    assert _text(BAR) in _text(stage).replace("&lt;", "<")
    assert "widget-view+json" not in stage and "@jupyter-widgets/html-manager" not in stage   # no widget JS from a CDN


def test_toc_keeps_inline_code(built):
    "Issue 27 item 8: the page's table of contents names a heading with its code, and links to the heading's own id."
    site, _ = built
    page = (site / "notebooks" / f"{STAGE}.html").read_text()
    toc = re.findall(r'<a href="#([^"]+)" class="md-nav__link">\s*<span class="md-ellipsis">\s*(.*?)\s*</span>', page, re.S)
    names = dict((name.strip(), anchor) for anchor, name in toc)
    assert "How a turn ends: TurnEnd and find_stop" in names, sorted(names)
    ids = set(re.findall(r'\bid="([^"]+)"', page))
    assert all(anchor in ids for anchor in names.values()), [a for a in names.values() if a not in ids]


def test_tables_render(built):
    "Issue 27 item 5: every markdown table renders (no delimiter row left as text); a page with one that does not is caught."
    site, tmp = built
    for page in sorted(site.rglob("*.html")):
        prose = _text(page.read_text(), keep_code=False)
        assert not re.search(r"\|\s*:?-{3,}:?\s*\|", prose), f"{page.name}: a markdown table did not render"
    broken = tmp / "broken_table"
    shutil.copytree(site, broken)
    (broken / "t.html").write_text("<p>| | paper | here | |---|---|---| | a | 1/|x| | b |</p><pre>| a |\n|---|</pre>")
    assert any(p.startswith("t.html: a markdown table that did not render") for p in check_site(broken, NBS))


def test_pages_say_which_run(built):
    "Issue 27 item 10: the home page names the README's run, the Report page the run given to `make docs`."
    site, _ = built
    home, report = _text((site / "index.html").read_text()), _text((site / "report.html").read_text())
    readme = (REPO / "README.md").read_text()
    m = re.search(r"^Run `([^`]+)`, profile `([^`]+)`", readme, re.M)
    if "<!-- results:begin -->" in readme:
        assert "Which run: the results below are the README's" in home
        assert "show run run (profile smoke)" in home
        if m: assert f"from run {m[1]} (profile {m[2]})" in home
    assert "Which run: this page shows run run (profile smoke), the run make docs was given" in report


def test_a_broken_copy_is_caught(built):
    site, tmp = built
    broken = tmp / "broken"
    shutil.copytree(site, broken)
    (broken / "figures" / "sft_loss.png").unlink()
    victim = next(p.stem for p in sorted(NBS.glob("*.ipynb")) if p.stem != STAGE)
    (broken / "notebooks" / f"{victim}.html").unlink()
    (broken / "extra.html").write_text('<a href="notebooks/no_such/">x</a> <a href="https://example.org/">ok</a> <a href="#top">t</a>')
    problems = check_site(broken, NBS)
    assert f"notebook {victim}.ipynb has no page" in "\n".join(problems)
    assert "report.html: broken link 'figures/sft_loss.png'" in problems
    assert any(p.startswith("index.html: broken link") and f"{victim}.html" in p for p in problems)   # the nav points nowhere now
    assert "extra.html: broken link 'notebooks/no_such/'" in problems
    assert "extra.html: broken anchor '#top'" in problems            # a #fragment must name an id of its page
    assert not any("example.org" in p for p in problems)


@pytest.mark.timeout(300)
def test_companion_notebooks_are_executed_for_their_pages(tmp_path):
    "Issue 27 item 9: a lettered companion notebook's page shows its outputs (executed for the site), a stage's stays the run's."
    repo, run = tmp_path / "repo", tmp_path / "run"
    (repo / "nbs").mkdir(parents=True); (run / "notebooks").mkdir(parents=True)
    (repo / "README.md").write_text("# tiny\n")
    for name, code in [("01_stage", "print('stage')"), ("01a_world", "print('A-WORLD-' + str(6 * 7))")]:
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f"# {name}"), nbformat.v4.new_code_cell(code)])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "python3", "language": "python"}
        nbformat.write(nb, repo / "nbs" / f"{name}.ipynb")
    site = build_docs(run, tmp_path / "site", repo_root=repo, build_dir=tmp_path / "build")
    companion = (site / "notebooks" / "01a_world.html").read_text()
    assert "A-WORLD-42" in companion and "Shown without outputs" not in companion
    assert "Shown without outputs" in (site / "notebooks" / "01_stage.html").read_text()   # a stage: the run's copy or nothing


# -- the run's figures (issue 27 item 11): each plotting function on small data, the drawn figure inspected ---------------

@pytest.fixture
def figures(monkeypatch):
    "Every figure saved while the test runs, drawn, keyed by file name."
    saved, original = {}, matplotlib.figure.Figure.savefig
    def savefig(fig, path, *a, **kw):
        original(fig, path, *a, **kw); saved[Path(path).name] = fig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    return saved


def _renderer(fig):
    "`fig` drawn again (plt.close took its canvas): the renderer to measure it with."
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    FigureCanvasAgg(fig).draw()
    return fig.canvas.get_renderer()


def _overlap(a, b) -> bool:
    "Whether two display-space boxes overlap by more than a pixel."
    return min(a.x1, b.x1) - max(a.x0, b.x0) > 1 and min(a.y1, b.y1) - max(a.y0, b.y0) > 1


def _legend_covers_bars(fig) -> list[str]:
    "The axes of `fig` whose legend lies over one of their bars."
    r = _renderer(fig)
    return [ax.get_title() for ax in fig.axes if ax.get_legend()
            for bar in ax.patches if bar.get_height() and bar.get_width()
            if _overlap(ax.get_legend().get_window_extent(r), bar.get_window_extent(r))][:1]


def _whole_ticks(ax) -> bool:
    "Whether every x tick shown is a whole number."
    lo, hi = sorted(ax.get_xlim())
    return all(float(t).is_integer() for t in ax.get_xticks() if lo <= t <= hi)


def test_figures_whole_number_axes(figures, tmp_path):
    from datasets import Dataset
    from coa_lib.core import SPLITS, TASK_KINDS
    from coa_lib.flow_grpo import plot_flow_curves
    from coa_lib.rl import CURVES, plot_rl_curves
    from coa_lib.stage_tasks import plot_task_stats
    rows = lambda n: Dataset.from_dict({"kind": [TASK_KINDS[i % 6] for i in range(n)],
                                        "meta": [json.dumps({"hops": 1 + i % 4}) for i in range(n)]})
    plot_task_stats({s: rows(24) for s in SPLITS}, tmp_path / "tasks_hops.png")
    plot_rl_curves({k: [(2 * i, 0.1 * i) for i in range(3)] for k in CURVES}, tmp_path / "rl_curves.png")
    history = [{"step": s, "reward": 0.5, "tool_error_rate": 0.1, "turns": 3.0 + 1e-10 * s, "clip_frac": 0.0, "kl": 1e-10 * s,
                "tool_share/search": 0.5, "tool_share/python": 0.5} for s in (1, 2)]
    plot_flow_curves(history, tmp_path / "flow_grpo_curves.png")
    hops = figures["tasks_hops.png"].axes[0]
    assert hops.get_xlabel().startswith("hops") and _whole_ticks(hops)
    assert all(_whole_ticks(ax) for ax in figures["rl_curves.png"].axes)
    flow = figures["flow_grpo_curves.png"]
    _renderer(flow)
    assert all(_whole_ticks(ax) for ax in flow.axes if ax.has_data())
    w, h = flow.get_size_inches()
    assert w / h <= 2.5, f"a {w:.0f} x {h:.0f} in strip"
    assert [t for ax in flow.axes if (t := ax.yaxis.get_offset_text().get_text())] == []   # no +1e-10 above an axis


def test_figures_legends_cover_no_bars(figures, tmp_path):
    from datasets import Dataset
    from coa_lib.distill import plot_role_shares
    from coa_lib.mas import TRACE_COLUMNS
    from coa_lib.stage_teacher import plot_teacher_cost
    kinds = ["code", "comparison", "game24", "math", "mixed", "multihop"]
    n = 3 * len(kinds)
    cols = {c: [0] * n for c in TRACE_COLUMNS if c != "calls"}
    cols.update(kind=[kinds[i % 6] for i in range(n)], reward=[1.0] * n, prompt_tokens=[4900 if i % 6 in (1, 4) else 2500 for i in range(n)],
                completion_tokens=[500] * n, n_calls=[12 if i % 6 == 4 else 7 for i in range(n)], n_tool_calls=[3] * n,
                id=[str(i) for i in range(n)], question=[""] * n, answer=[""] * n, meta=["{}"] * n, final_answer=[""] * n)
    plot_teacher_cost(Dataset.from_dict(cols), tmp_path / "teacher_cost.png")
    shares = {"full wording": {"tokens_per_row": 366.0, **{r: 0.1 for r in ["think", "code", "reflection", "plan", "double_check",
                                                                          "suggested_answer", "answer", "layout", "web_search", "crawl_page"]}},
              "compact": {"tokens_per_row": 200.0, **{r: 0.1 for r in ["think", "code", "reflection", "plan", "double_check",
                                                                     "suggested_answer", "answer", "layout", "web_search", "crawl_page"]}}}
    plot_role_shares(shares, tmp_path / "distill_role_shares.png")
    assert _legend_covers_bars(figures["teacher_cost.png"]) == []
    assert _legend_covers_bars(figures["distill_role_shares.png"]) == []


def test_sft_results_ticks_and_points(figures, tmp_path):
    from coa_lib.core import TASK_KINDS
    from coa_lib.evaluate import plot_results
    mk = lambda acc, tok, ci: {"by_kind": {k: {"accuracy": acc} for k in TASK_KINDS}, "accuracy": acc, "accuracy_ci95": ci,
                               "mean_processed_tokens": tok}
    plot_results({"teacher_mas": mk(1.0, 3600, (0.61, 1.0)), "coa": mk(0.0, 195, (0.0, 0.39)), "coa_unfiltered": mk(0.0, 195, (0.0, 0.39)),
                  "react": mk(0.0, 185, (0.0, 0.39)), "direct": mk(0.0, 150, (0.0, 0.39))}, tmp_path / "sft_results.png")
    fig = figures["sft_results.png"]
    r = _renderer(fig)
    acc, vs_tokens = fig.axes[:2]
    labels = [t for t in vs_tokens.get_xticklabels(minor=False) + vs_tokens.get_xticklabels(minor=True)
              if t.get_text() and t.get_visible() and vs_tokens.get_xlim()[0] <= t.get_position()[0] <= vs_tokens.get_xlim()[1]]
    boxes = [t.get_window_extent(r) for t in labels]
    assert len(boxes) >= 2 and not any(_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:]), [t.get_text() for t in labels]
    points = [(line.get_marker(), line.get_markersize()) for line in vs_tokens.lines if line.get_marker() not in (None, "None", "", "_")]
    assert len(points) == 5 and len(set(points)) == 5        # coa and coa_unfiltered at one place: two shapes, both seen
    assert _legend_covers_bars(fig) == []
