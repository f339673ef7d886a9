"""harness.config.titan_cli: a torchtitan option its parser refuses is one line built from tyro's event.

torchtitan's own parser (ConfigManager.parse_args -> tyro.cli) parses the options on the
built config; tyro hands the refusal to the hook ``tyro._errors.on_parse_error`` as a
structured event (UnrecognizedArgs, BadValue, InvalidChoice, InstantiationFailure) and
harness.config.titan_cli turns it into the line below. Nothing tyro prints is read back: each
case asserts the whole line, and that tyro printed nothing.
"""

from __future__ import annotations

import pytest

from harness.checks.errors import PreflightError
from harness.config.titan_cli import apply_cli_overrides

FRAME = "; fix or drop it (torchtitan options are --SECTION.FIELD VALUE of the recipe's Trainer.Config; given: {})"

#: One per kind of tyro event: the options given and what the refusal says before FRAME.
KINDS = {
    "unknown option": (
        ["--training.stepz", "3"],
        "unknown option --training.stepz (did you mean --training.steps?)",
    ),
    "unknown option, --flag=value": (
        ["--seq_len=64"],
        "unknown option --seq_len (did you mean --training.seq_len?)",
    ),
    "bad value type": (
        ["--training.steps", "three"],
        "--training.steps takes INT, not 'three' (invalid literal for int() with base 10: 'three')",
    ),
    "missing value": (["--training.steps"], "--training.steps is missing its value (INT)"),
    "invalid choice": (
        ["--training.dtype", "float17"],
        "--training.dtype got 'float17'; choose one of bfloat16, float32",
    ),
    "value without an option": (
        ["--training.steps", "3", "4"],
        "unexpected value 4 (no option before it takes it)",
    ),
}


@pytest.fixture(scope="module")
def config():
    from harness.checks.preflight import preflight
    from harness.config.build import build_config
    from harness.options.run_options import RunOptions

    return build_config(preflight(RunOptions(recipe="native_qwen3", tier="cpu", init="random")), [])


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_of_tyro_refusal_is_one_line_naming_option_value_and_fix(kind, config, capfd):
    given, what = KINDS[kind]
    with pytest.raises(PreflightError) as refusal:
        apply_cli_overrides(config, given)
    assert str(refusal.value) == "torchtitan option refused: " + what + FRAME.format(
        " ".join(given)
    )
    out, err = capfd.readouterr()
    assert out + err == "", "tyro printed something (its error box?)"


def test_an_accepted_option_reaches_the_config(config):
    assert apply_cli_overrides(config, ["--training.steps", "3"]).training.steps == 3
    assert config.training.steps != 3, "the parser works on a copy"


def test_a_suggestion_is_an_option_torchtitans_parser_takes(config):
    """``model_spec`` is a field of Trainer.Config that tyro hides (tyro.conf.Suppress): never suggested."""
    with pytest.raises(PreflightError) as refusal:
        apply_cli_overrides(config, ["--model_spec.nam", "x"])
    assert str(refusal.value).startswith(
        "torchtitan option refused: unknown option --model_spec.nam; fix or drop it"
    )


def test_a_tyro_without_parse_error_hooks_shows_its_own_message(config, monkeypatch, capsys):
    """tyro < 1.0.14 has no tyro._errors.on_parse_error: its printed reason stays, above a generic refusal."""
    import tyro._errors

    monkeypatch.delattr(tyro._errors, "on_parse_error")
    with pytest.raises(PreflightError) as refusal:
        apply_cli_overrides(config, ["--training.stepz", "3"])
    assert str(refusal.value) == (
        "torchtitan option refused: see tyro's message above (this tyro has no tyro._errors.on_parse_error)"
        + FRAME.format("--training.stepz 3")
    )
    assert "--training.stepz" in capsys.readouterr().err
