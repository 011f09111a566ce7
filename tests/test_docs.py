"The tutorial site (`make docs`): every real notebook gets a page, a run's executed copy and report show, links resolve."
import shutil, time
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


def _png(path: Path, title: str) -> Path:
    "A small matplotlib figure saved as PNG."
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1, 2], [3, 1, 2]); ax.set_title(title)
    fig.savefig(path); plt.close(fig)
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    "The site of the real nbs/ and README against a fake run dir: one executed stage notebook, report.md with figures."
    tmp = tmp_path_factory.mktemp("docs")
    run = tmp / "run"
    (run / "notebooks").mkdir(parents=True)
    nb = nbformat.read(NBS / f"{STAGE}.ipynb", as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=MARK + "\n")]
    nbformat.write(nb, run / "notebooks" / f"{STAGE}.ipynb")
    _png(run / "figures" / "sft_loss.png", "loss")
    _png(run / "rl" / "curve.png", "curve")     # a figure outside figures/, linked by the report
    (run / "report.md").write_text("# Report\n\n| system | accuracy |\n|---|---:|\n| coa | 24.0 |\n\n"
                                   "![SFT loss](figures/sft_loss.png)\n\n![RL curve](rl/curve.png)\n")
    t0 = time.time()
    # a cache kept between runs (git-ignored build/): mkdocs-jupyter renders only the notebooks that changed (cold: ~50 s)
    site = build_docs(run, tmp / "site", repo_root=REPO, build_dir=tmp / "build", cache_dir=REPO / "build" / "docs_test_cache")
    print(f"full site built in {time.time() - t0:.1f} s")
    return site, tmp


@pytest.mark.timeout(600)
def test_site_is_complete_and_links_resolve(built):
    site, _ = built
    assert check_site(site, NBS) == []
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
    assert not any("example.org" in p or "'#top'" in p for p in problems)
