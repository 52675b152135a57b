"""Models own their options: each declares them, `--model-options NAME.KEY=VALUE` sets them, a mistake in one
is refused before the server binds, naming the entry and what it takes; --lm-size and --mlp-width, the server
settings they replaced, still work, with a warning naming the new spelling."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Literal

import pytest
import torch

from process.flags import setting
from server.config import Settings, parser
from server.runtimes import registry
from server.runtimes.byte_lm import ByteLmOptions
from server.runtimes.former_factory import FormerSettings
from server.runtimes.mlp import MlpModel, MlpOptions
from server.runtimes.options import ModelContext, NoOptions
from server.runtimes.registry import build_models, check_models, model_options, register_model


@pytest.fixture(autouse=True)
def _registry_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # registrations here stay here


def settings(*flags: str) -> Settings:
    return Settings.from_args(["--models", "mlp,byte-lm", *flags])


def test_each_model_gets_its_own_options_with_the_defaults_for_the_rest() -> None:
    options = model_options(settings("--model-options", "mlp.width=256"))
    assert options["mlp"] == MlpOptions(width=256)
    assert options["byte-lm"] == ByteLmOptions(size="tiny")
    assert options["all-minilm-l6-v2"] == NoOptions()


def test_the_models_are_built_with_their_options_and_the_servers_limits() -> None:
    mlp, lm = build_models(
        settings("--model-options", "mlp.width=16,byte-lm.size=small", "--max-batch-size", "5"),
        torch.device("cpu"),
    )
    assert "512->16x3->512" in mlp.descriptor.description and mlp.descriptor.limits.max_batch_size == 5
    assert lm.descriptor.version == "1-small"


def test_the_former_flags_still_work_and_warn_once_each_naming_the_new_spelling(
    capsys: pytest.CaptureFixture[str],
) -> None:
    s = settings("--lm-size", "small", "--mlp-width", "256")
    assert s.model_options == ("byte-lm.size=small", "mlp.width=256")
    assert model_options(s)["mlp"] == MlpOptions(width=256)
    assert capsys.readouterr().err.splitlines() == [
        "sluice serve: warning: --lm-size is deprecated; use --model-options byte-lm.size=small",
        "sluice serve: warning: --mlp-width is deprecated; use --model-options mlp.width=256",
    ]


def test_the_new_spelling_wins_over_a_former_flag_for_the_same_key(
    capsys: pytest.CaptureFixture[str],
) -> None:
    s = settings("--model-options", "mlp.width=64", "--mlp-width", "256")
    assert model_options(s)["mlp"] == MlpOptions(width=64)
    assert "--mlp-width is deprecated" in capsys.readouterr().err


def test_no_warning_without_a_former_flag(capsys: pytest.CaptureFixture[str]) -> None:
    settings("--model-options", "mlp.width=64")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("byte-lm.size=huge", "--model-options byte-lm.size takes tiny, small or bench, not 'huge'"),
        ("mlp.width=wide", "--model-options mlp.width takes an integer, not 'wide'"),
        ("mlp.width=0", "--model-options mlp.width=0: width must be >= 1"),
        ("mlp.colour=red", "--model-options mlp.colour: mlp has no option colour (it has: width"),
        ("all-minilm-l6-v2.pooling=cls", "all-minilm-l6-v2 takes no options"),
        ("gpt.size=small", "gpt is not a registered model; models with options: byte-lm, mlp"),
    ],
)
def test_a_bad_entry_is_refused_before_the_server_binds_naming_it(entry: str, says: str) -> None:
    with pytest.raises(ValueError, match="invalid setting model_options: ") as caught:
        check_models(settings("--model-options", entry))
    assert says in str(caught.value)


def test_a_former_flag_with_a_bad_value_is_refused_as_its_new_spelling() -> None:
    with pytest.raises(ValueError, match=r"byte-lm\.size takes tiny, small or bench, not 'huge'"):
        check_models(settings("--lm-size", "huge"))


def test_an_entry_that_is_not_name_key_value_is_refused_with_the_settings() -> None:
    for entry in ("mlp.width", "width=3", ".width=3", "mlp.=3"):
        with pytest.raises(ValueError, match=r"invalid setting model_options: each entry is NAME\.KEY=VALUE"):
            settings("--model-options", entry)


def test_a_model_name_may_hold_dots() -> None:
    with pytest.raises(ValueError, match=r"qwen2\.5 is not a registered model"):
        check_models(settings("--model-options", "qwen2.5.size=1"))


def test_a_plugin_declares_typed_options_and_its_factory_gets_them_not_the_settings() -> None:
    @dataclass(frozen=True, slots=True, kw_only=True)
    class DoublerOptions:
        factor: float = setting(2.0, help="what x is multiplied by")
        rounding: Literal["none", "half"] = setting("none", help="how y is rounded")
        verbose: bool = setting(False, help="log each batch")

    built: list[tuple[DoublerOptions, ModelContext]] = []

    def factory(options: DoublerOptions, context: ModelContext) -> MlpModel:
        built.append((options, context))
        return MlpModel(width=8, max_batch_size=context.max_batch_size, device=context.device)

    register_model("doubler", factory, options=DoublerOptions)
    s = Settings.from_args(
        [
            "--models",
            "doubler",
            "--model-options",
            "doubler.factor=3,doubler.verbose=on,doubler.rounding=half",
        ]
    )
    check_models(s)
    build_models(s, torch.device("cpu"))
    assert built == [
        (
            DoublerOptions(factor=3.0, rounding="half", verbose=True),
            ModelContext(device=torch.device("cpu"), max_batch_size=32, context_length=0, max_sequences=256),
        )
    ]
    with pytest.raises(ValueError, match=r"doubler\.factor takes a number, not 'x'"):
        check_models(Settings.from_args(["--model-options", "doubler.factor=x"]))
    assert "doubler.rounding=none|half" in parser().format_help()


def test_a_variant_takes_the_options_of_the_model_it_varies() -> None:
    widths: list[int] = []

    def wide(options: MlpOptions, context: ModelContext) -> MlpModel:
        widths.append(options.width)
        return MlpModel(width=options.width, max_batch_size=context.max_batch_size, device=context.device)

    register_model("wide", wide, options_of="mlp")
    build_models(Settings.from_args(["--models", "wide", "--mlp-width", "24"]), torch.device("cpu"))
    assert widths == [24]
    with pytest.raises(ValueError, match=r"wide takes the options of mlp; give mlp\.width"):
        check_models(Settings.from_args(["--model-options", "wide.width=8"]))


def test_a_declaration_the_options_cannot_parse_into_is_refused_at_registration() -> None:
    @dataclass(frozen=True)
    class NoDefault:
        width: int

    @dataclass(frozen=True)
    class Listed:
        widths: tuple[int, ...] = setting((), help="widths")

    def factory(options: object, context: ModelContext) -> MlpModel:
        return MlpModel(width=1, max_batch_size=1, device=context.device)

    with pytest.raises(TypeError, match="every option of a needs a default"):
        register_model("a", factory, options=NoDefault)
    with pytest.raises(TypeError, match=r"option b\.widths is a"):
        register_model("b", factory, options=Listed)
    assert "a" not in registry._REGISTRY and "b" not in registry._REGISTRY


def test_help_lists_every_registered_models_options_with_type_and_default() -> None:
    text = parser().format_help()
    assert "byte-lm.size=tiny|small|bench  size of the embedded byte LM (default: tiny)" in text
    assert "mlp.width=N                    hidden width of the embedded MLP (units; default: 2048)" in text
    assert "--lm-size VALUE       deprecated: --model-options byte-lm.size=VALUE" in text


def test_a_factory_of_the_former_settings_device_form_registers_with_a_deprecation_warning() -> None:
    read: list[tuple[int, int, torch.device]] = []

    def former(settings: Any, device: torch.device) -> MlpModel:  # 0.1.0's form; Settings had mlp_width
        read.append((settings.max_batch_size, settings.mlp_width, device))
        return MlpModel(width=settings.mlp_width, max_batch_size=1, device=device)

    with pytest.warns(DeprecationWarning, match="ModelContext") as caught:
        register_model("old", former)
    [warning] = caught.list
    assert str(warning.message) == (
        "register_model('old'): a factory taking (settings, device) is deprecated and will stop working in "
        "Sluice 0.3.0; take a ModelContext instead (lambda context: Model(context.device); it also has "
        "max_batch_size, context_length and max_sequences) and declare the model's own settings with "
        "register_model(..., options=...)"
    )
    assert warning.filename == __file__, "attributed to the register_model() call, where the fix goes"
    [model] = build_models(
        Settings.from_args(["--models", "old", "--max-batch-size", "5", "--mlp-width", "24"]),
        torch.device("cpu"),
    )
    assert read == [(5, 24, torch.device("cpu"))]
    assert "512->24x3->512" in model.descriptor.description


def test_the_former_settings_read_every_setting_the_moved_ones_included_and_change_none() -> None:
    s = Settings.from_args(["--model-options", "byte-lm.size=small", "--max-queue", "3"])
    view = FormerSettings(s, model_options(s))
    assert (view.max_queue, view.lm_size, view.mlp_width) == (3, "small", 2048)
    with pytest.raises(AttributeError, match="read-only"):
        view.max_queue = 4
    with pytest.raises(AttributeError):
        _ = view.no_such_setting


def test_a_context_factory_registers_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        register_model("new", lambda context: MlpModel(width=4, max_batch_size=1, device=context.device))
    assert not registry._REGISTRY["new"].former


@pytest.mark.parametrize(
    "factory",
    [
        lambda: None,
        lambda settings, device, extra: None,
        lambda *, context: None,
    ],
)
def test_a_factory_of_neither_form_is_refused_when_its_plugin_is_imported(factory: object) -> None:
    with pytest.raises(TypeError, match=r"register_model\('odd'\): the factory must take a ModelContext"):
        register_model("odd", factory)  # type: ignore[call-overload]
    assert "odd" not in registry._REGISTRY
