"bench/sft_ladder.py: every rung's arguments make a valid SFT config at both profiles, whatever the profile's own base is."
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from sft_ladder import build_parser, rung_config, teacher_config


@pytest.mark.parametrize("profile", ["smoke", "full"])
def test_a_rung_without_a_base_has_no_base_phases(profile):
    cfg = rung_config(build_parser().parse_args(["--profile", profile, "--label", "r", "--phase", "all:1000"]))
    assert (cfg.base_reading, cfg.base_reading_steps) == (0.0, 0)          # the ladder's bases are its own arguments
    assert cfg.size == "nano" and cfg.lanes == 1


def test_a_rung_from_the_reading_curriculum():
    args = ["--label", "r", "--phase", "all:1000", "--base-steps", "2500", "--base-reading", "0.7", "--base-reading-steps", "2000"]
    cfg = rung_config(build_parser().parse_args(args))
    assert (cfg.base_reading, cfg.base_reading_steps) == (0.7, 2000)


def test_a_reading_curriculum_without_a_share_is_refused():
    with pytest.raises(ValueError, match="needs a share of reading rows"):
        rung_config(build_parser().parse_args(["--label", "r", "--phase", "all:1000", "--base-reading-steps", "2000"]))


def test_data_style_flags_build_the_teacher_config():
    a = build_parser().parse_args(["--span-findings", "--sentence-kind", "comparison"])
    assert teacher_config(a).style.sentence_kinds == ("comparison",)
    with pytest.raises(ValueError, match="needs compare_by_code"):
        teacher_config(build_parser().parse_args(["--compare-cue"]))


def test_data_style_flags_default_to_the_profiles_style():
    from coa_lib.mas import TeacherConfig
    for profile in ("smoke", "full"):
        style = TeacherConfig.for_profile(profile).style
        assert teacher_config(build_parser().parse_args(["--profile", profile])).style == style
        assert teacher_config(build_parser().parse_args(["--profile", profile, "--no-code-cue"])).style.code_cue is False
        assert teacher_config(build_parser().parse_args(["--profile", profile, "--code-cue"])).style.code_cue is True
        assert teacher_config(build_parser().parse_args(["--profile", profile, "--restate-question", "--no-restate-plan-line"])).style.restate_question is True
        assert teacher_config(build_parser().parse_args(["--profile", profile])).style.restate_question is False
        assert teacher_config(build_parser().parse_args(["--profile", profile, "--no-restate-plan-line"])).style.restate_plan_line is False
        assert teacher_config(build_parser().parse_args(["--profile", profile])).style.restate_plan_line is True   # the profiles' since 2026-12-07
        assert teacher_config(build_parser().parse_args(["--profile", profile, "--next-step-cue"])).style.next_step_cue is True
        assert teacher_config(build_parser().parse_args(["--profile", profile, "--plan-phrases"])).style.plan_phrases is True
    assert teacher_config(build_parser().parse_args(["--profile", "full"])).style.code_cue   # the profile's students learn cued programs


def test_comparison_rows_in_the_reading_phase():
    args = ["--label", "r", "--phase", "all:1000", "--base-steps", "2500", "--base-reading", "0.7", "--base-reading-steps", "2000",
            "--base-compare", "0.3"]
    assert rung_config(build_parser().parse_args(args)).base_compare == 0.3
    with pytest.raises(ValueError, match="needs base_reading > 0"):
        rung_config(build_parser().parse_args(["--label", "r", "--phase", "all:1000", "--base-compare", "0.3"]))


def test_comparison_rows_at_their_default_leave_every_key_as_it_was():
    "An added field at its default is left out of config hashes: bases and students built before it are found again."
    from dataclasses import replace
    from coa_lib.core import config_settings
    from coa_lib.sft import SFTStageConfig
    full = SFTStageConfig.for_profile("full")
    assert "base_compare" not in config_settings(full)                     # the default adds nothing to any key
    assert config_settings(replace(full, base_compare=0.3)) != config_settings(full)


def test_tail_averaging_flags():
    args = ["--label", "r", "--phase", "all:1000", "--average-from", "0.8", "--keep-last"]
    cfg = rung_config(build_parser().parse_args(args))
    assert (cfg.average_from, cfg.keep_last_iterate) == (0.8, True)
    with pytest.raises(ValueError, match="keep_last_iterate needs it"):
        rung_config(build_parser().parse_args(["--label", "r", "--phase", "all:1000", "--keep-last"]))
    with pytest.raises(ValueError, match=r"must be a share in \[0, 1\)"):
        rung_config(build_parser().parse_args(["--label", "r", "--phase", "all:1000", "--average-from", "1.5"]))


def test_tail_averaging_leaves_the_base_key_as_it_was():
    "The students' averaging is not the base's: a rung with --average-from finds the base built without it (it once rebuilt it)."
    from dataclasses import replace
    from coa_lib.core import config_settings
    from coa_lib.sft import SFTStageConfig
    from coa_lib.stage_sft import _base_phase_config
    full = SFTStageConfig.for_profile("full")
    averaged = replace(full, average_from=0.8, keep_last_iterate=True)
    assert config_settings(_base_phase_config(averaged, 2500)) == config_settings(_base_phase_config(full, 2500))
    assert config_settings(averaged) != config_settings(full)                # the students themselves are other models


def test_the_base_learning_rate_is_the_profiles_unless_given(monkeypatch):
    "`--base-lr` reaches the base's config and its name; without it the profile's rate and the names of every earlier rung."
    import coa_lib.stage_sft
    import sft_ladder
    from coa_lib.sft import SFTStageConfig
    args = ["--label", "r", "--phase", "all:1000", "--size", "small", "--base-steps", "2500"]
    seen = {}
    monkeypatch.setattr(coa_lib.stage_sft, "pretrain_base",
                        lambda rd, cfg, out_dir, quote_dir: seen.update(lr=cfg.base_lr, out=out_dir.name, quote=quote_dir.name))
    for extra, lr, name in (([], SFTStageConfig.for_profile("full").base_lr, "base_quote_small_2500"),
                            (["--base-lr", "3e-4"], 3e-4, "base_quote_small_2500_lr0.0003")):
        a = build_parser().parse_args(args + extra)
        assert rung_config(a).base_lr == lr
        sft_ladder.ladder_base(Path("/nonexistent"), rung_config(a), a)
        assert seen == {"lr": lr, "out": name, "quote": name}


def test_a_base_learning_rate_below_zero_is_refused():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--base-lr", "-1"])
