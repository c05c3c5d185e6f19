"""Environment switches: one strict parser, problems collected on the Config."""

import os
import re
from pathlib import Path

import pytest

from torch_overlay._config import Config, KNOWN_VARIABLES, load_config, parse_switch, REPORTED, SWITCHES

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("value", ["1", "true", "YES", " On ", "True"])
def test_true_values(value):
    assert parse_switch("X", value, default=False) == (True, None)


@pytest.mark.parametrize("value", ["0", "false", "No", " OFF", "FALSE "])
def test_false_values(value):
    assert parse_switch("X", value, default=True) == (False, None)


@pytest.mark.parametrize("value", [None, "", "   "])
def test_unset_or_empty_is_the_default(value):
    assert parse_switch("X", value, default=True) == (True, None)
    assert parse_switch("X", value, default=False) == (False, None)


@pytest.mark.parametrize("value", ["disabled", "n", "2", "ture"])
def test_kill_switch_unrecognised_disables(value):
    config = load_config({"TORCH_OVERLAY": value})
    assert config.enabled is False
    (problem,) = config.problems
    assert "TORCH_OVERLAY" in problem and repr(value) in problem
    assert "1/true/yes/on" in problem and "0/false/no/off" in problem
    assert "overlay is disabled" in problem


@pytest.mark.parametrize("value", ["disabled", "enabled", "y"])
def test_strict_unrecognised_stays_off(value):
    config = load_config({"TORCH_OVERLAY_STRICT": value})
    assert config.enabled is True
    assert config.strict is False
    (problem,) = config.problems
    assert "TORCH_OVERLAY_STRICT" in problem and repr(value) in problem


def test_strict_on():
    assert load_config({"TORCH_OVERLAY_STRICT": "yes"}).strict is True


def test_reach_switch():
    assert load_config({}).reach is False
    assert load_config({"TORCH_OVERLAY_REACH": "on"}).reach is True
    config = load_config({"TORCH_OVERLAY_REACH": "all"})
    assert config.reach is False
    (problem,) = config.problems
    assert "TORCH_OVERLAY_REACH='all'" in problem and "not watched" in problem


def test_code_cache_switch():
    assert load_config({}).code_cache is True
    assert load_config({"TORCH_OVERLAY_CODE_CACHE": "no"}).code_cache is False
    assert load_config({"TORCH_OVERLAY_CODE_CACHE": "Off"}).code_cache is False
    config = load_config({"TORCH_OVERLAY_CODE_CACHE": "nope"})
    assert config.code_cache is False
    assert "TORCH_OVERLAY_CODE_CACHE" in config.problems[0]


def test_valid_environment_has_no_problems():
    env = {"TORCH_OVERLAY": "on", "TORCH_OVERLAY_STRICT": "0", "TORCH_OVERLAY_CODE_CACHE": "true"}
    assert load_config(env).problems == ()


def test_cache_dir(tmp_path):
    assert load_config({"TORCH_OVERLAY_CACHE_DIR": str(tmp_path)}).cache_dir == tmp_path
    xdg = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert load_config(xdg).cache_dir == tmp_path / "xdg" / "torch_overlay"
    # Empty values and a relative XDG_CACHE_HOME (invalid per the XDG spec) fall through.
    fallback = Path("~/.cache/torch_overlay").expanduser()
    assert load_config({"TORCH_OVERLAY_CACHE_DIR": "", "XDG_CACHE_HOME": ""}).cache_dir == fallback
    assert load_config({"XDG_CACHE_HOME": "relative"}).cache_dir == fallback


def test_disable_list():
    assert load_config({"TORCH_OVERLAY_DISABLE": " a, b ,,"}).disabled_ids == frozenset({"a", "b"})


def test_new_fields_have_defaults(tmp_path):
    config = Config(enabled=True, disabled_ids=frozenset(), strict=False, patches_dir=tmp_path)
    assert config.code_cache is True
    assert config.problems == ()
    assert config.cache_dir == load_config(os.environ).cache_dir


def test_a_misspelled_variable_names_the_closest_known_one():
    (problem,) = load_config({"TORCH_OVERLAY_DISABLED": "aot-fresh-alias-outputs"}).problems
    assert problem.startswith("TORCH_OVERLAY_DISABLED is not a torch_overlay variable")
    assert "did you mean TORCH_OVERLAY_DISABLE?" in problem


def test_an_unknown_variable_far_from_any_lists_the_switches():
    (problem,) = load_config({"TORCH_OVERLAY_XYZZY": "1"}).problems
    assert "TORCH_OVERLAY_XYZZY" in problem and "did you mean" not in problem
    assert "TORCH_OVERLAY_DISABLE" in problem and "TORCH_OVERLAY_STRICT" in problem


def test_variables_of_build_sh_and_the_tests_are_known():
    env = {name: "1" for name in KNOWN_VARIABLES}
    env["TORCH_OVERLAY_CHECK_RANKS"] = "fail"
    assert load_config(env).problems == ()


def test_every_variable_the_repository_reads_is_known():
    # A variable read somewhere but missing here would be warned about as a typo.
    read = re.compile(r"""(?:environ\.get\(|environ\[|getenv\()["'](TORCH_OVERLAY_[A-Z_]+)""")
    python = [*REPO.glob("torch_overlay/**/*.py"), *REPO.glob("tests/**/*.py"), *REPO.glob("benchmarks/*.py")]
    names = {m for f in python for m in read.findall(f.read_text(encoding="utf-8"))}
    for script in (REPO / "build.sh", *(REPO / ".ci").glob("*")):  # any name a shell script mentions
        names |= set(re.findall(r"TORCH_OVERLAY_[A-Z_]+", script.read_text(encoding="utf-8")))
    assert {"TORCH_OVERLAY_CACHE_DIR", "TORCH_OVERLAY_VENVS", "TORCH_OVERLAY_TEST_LEG"} <= names
    assert names <= KNOWN_VARIABLES, names - KNOWN_VARIABLES
    # ... and one no longer read anywhere would hide a typo of its name.
    assert KNOWN_VARIABLES - set(SWITCHES) - {REPORTED} <= names


@pytest.mark.parametrize(
    ("value", "mode"), [(None, "off"), ("0", "off"), ("1", "warn"), ("warn", "warn"), ("FAIL", "fail")]
)
def test_check_ranks_modes(value, mode):
    env = {} if value is None else {"TORCH_OVERLAY_CHECK_RANKS": value}
    config = load_config(env)
    assert (config.check_ranks, config.problems) == (mode, ())


def test_check_ranks_not_understood_still_checks():
    config = load_config({"TORCH_OVERLAY_CHECK_RANKS": "fial"})
    assert config.check_ranks == "warn"
    (problem,) = config.problems
    assert "TORCH_OVERLAY_CHECK_RANKS='fial'" in problem and "warn, fail" in problem
