"""`sluice up` routes each flag to the process it belongs to (issue 18, item 6): shared settings to both, the
server's under their own names, the shim's under theirs or --shim-NAME where the server has that name; the
server's --tls-cert is the shim's upstream trust unless --upstream-ca says otherwise; every setting of both
processes is reachable, and the children's own parsers take what `up` passes them."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.up import dial_address
from launcher.up_flags import SET_BY_UP, parser, routes, shim_flags_named, split
from process.flags import FlagError
from server.config import Settings
from server.config import parser as server_parser
from shim.config import ShimSettings


def pairs(line: tuple[str, ...]) -> dict[str, str]:
    assert len(line) % 2 == 0, line
    return dict(zip(line[::2], line[1::2], strict=True))


def test_the_acceptance_command_gives_keys_to_both_tls_to_the_server_and_its_certificate_to_the_shim() -> (
    None
):
    argv = split(
        [
            *("--auth-keys", "k.toml", "--tls-cert", "c.pem", "--tls-key", "k.pem"),
            *("--cors-allow-origins", "https://app.example", "--grpc-port", "0", "--http-port", "0"),
        ]
    )
    assert pairs(argv.server) == {
        "--auth-keys": "k.toml",
        "--tls-cert": "c.pem",
        "--tls-key": "k.pem",
        "--port": "0",
    }
    assert pairs(argv.shim) == {
        "--auth-keys": "k.toml",
        "--cors-allow-origins": "https://app.example",
        "--port": "0",
        "--upstream-ca": "c.pem",  # the server's certificate, pinned
    }


def test_upstream_ca_names_the_ca_the_shim_trusts_instead() -> None:
    argv = split(["--tls-cert", "c.pem", "--tls-key", "k.pem", "--upstream-ca", "ca.pem"])
    assert pairs(argv.shim) == {"--upstream-ca": "ca.pem"}
    assert "--upstream-ca" not in argv.server


def test_a_name_both_use_for_different_things_keeps_the_servers_and_the_shims_is_prefixed() -> None:
    argv = split(
        [
            *("--max-connections", "100", "--shim-max-connections", "7", "--access-log", "1"),
            *("--shim-access-log", "0.5", "--shim-tls-cert", "h.pem", "--shim-tls-key", "hk.pem"),
            *("--max-message-bytes", "2048", "--shim-max-message-bytes", "4096", "--shim-workers", "3"),
        ]
    )
    assert pairs(argv.server) == {
        "--max-connections": "100",
        "--access-log": "1",
        "--max-message-bytes": "2048",
    }
    assert pairs(argv.shim) == {
        "--access-log": "0.5",
        "--tls-cert": "h.pem",
        "--tls-key": "hk.pem",
        "--max-connections": "7",
        "--max-message-bytes": "4096",
        "--workers": "3",
    }


def test_the_interface_goes_to_both_and_server_only_flags_stay_with_the_server() -> None:
    argv = split(["--host", "0.0.0.0", "--max-queue", "8", "--models", "mlp", "--header-timeout-s", "3"])
    assert pairs(argv.server) == {"--host": "0.0.0.0", "--max-queue": "8", "--models": "mlp"}
    assert pairs(argv.shim) == {"--host": "0.0.0.0", "--header-timeout-s": "3"}


def test_shared_memory_is_off_unless_up_passes_its_flags_to_the_server() -> None:
    assert Settings.from_args([]).kserve_shm is False
    argv = split(["--kserve-shm", "true", "--kserve-shm-max-regions", "4", "--kserve-shm-max-bytes", "4096"])
    assert argv.shim == ()
    settings = Settings(**vars(server_parser().parse_args(argv.server)))
    assert settings.kserve_shm is True
    assert (settings.kserve_shm_max_regions, settings.kserve_shm_max_bytes) == (4, 4096)


def test_nothing_given_passes_nothing_so_each_child_keeps_its_defaults() -> None:
    argv = split([])
    assert argv.server == () and argv.shim == ()


def test_every_setting_of_both_processes_has_exactly_one_flag_and_up_sets_the_upstream() -> None:
    reached = {(child, route.field) for route in routes() for child in route.to}
    server = {("server", f.name) for f in dataclasses.fields(Settings)}
    shim = {("shim", f.name) for f in dataclasses.fields(ShimSettings) if f.name not in SET_BY_UP}
    assert reached == server | shim
    flags = [route.flag for route in routes()]
    assert len(flags) == len(set(flags))
    assert "--upstream" not in flags and "--port" not in flags and "--workers" not in flags


def test_what_up_passes_parses_to_the_values_given() -> None:
    argv = split(
        [
            *(
                "--models",
                "mlp,byte-lm",
                "--reflection",
                "off",
                "--max-concurrency",
                "auto",
                "--grace-s",
                "2",
            ),
            *("--shim-max-connections", "9", "--cors-allow-origins", "https://a.example,https://b.example"),
        ]
    )
    settings = Settings(**vars(server_parser().parse_args(argv.server)))
    assert settings.models == ("mlp", "byte-lm") and settings.reflection is False
    assert settings.max_concurrency is None and settings.grace_s == 2.0
    shim = ShimSettings.from_args(argv.shim)
    assert shim.max_connections == 9
    assert shim.cors_allow_origins == ("https://a.example", "https://b.example")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--max-qeue", "8"], "did you mean: --max-qeue -> --max-queue?"),
        (["--shim-max-connections", "many"], "argument --shim-max-connections: takes an integer"),
        (["--upstream", "elsewhere:1"], "ambiguous option: --upstream could match"),
        (["--workers", "2"], "unrecognized arguments: --workers"),
    ],
)
def test_a_flag_that_does_not_parse_is_named_as_up_calls_it(argv: list[str], says: str) -> None:
    with pytest.raises(FlagError, match=says):
        split(argv)


def test_tls_settings_that_cannot_work_together_are_refused() -> None:
    with pytest.raises(ValueError, match="give --tls-cert"):
        split(["--upstream-ca", "ca.pem"])
    with pytest.raises(ValueError, match="--upstream-cert and --upstream-key"):
        split(["--tls-cert", "c", "--tls-key", "k", "--tls-client-ca", "ca"])
    mtls = ["--upstream-cert", "sc", "--upstream-key", "sk"]
    argv = split(["--tls-cert", "c", "--tls-key", "k", "--tls-client-ca", "ca", *mtls])
    assert pairs(argv.shim) == {"--upstream-cert": "sc", "--upstream-key": "sk", "--upstream-ca": "c"}


def test_help_groups_the_flags_by_the_process_they_go_to_and_names_them_as_up_does() -> None:
    text = " ".join(parser().format_help().split())
    text = text[text.index("options:") :]  # the groups, not the usage line
    both, server, shim = (text.index(title) for title in ("server and shim (", "server (see", "shim (see"))
    assert both < text.index("--auth-keys TEXT") < server < text.index("--max-queue N") < shim
    assert shim < text.index("--cors-allow-origins") and shim < text.index("--shim-tls-cert TEXT")
    assert "--shim-tls-key TEXT PEM private key of --shim-tls-cert" in text
    assert "(default: the server's --tls-cert, pinned; plaintext without it)" in text
    assert "(requests; default: 64)" in text


def test_a_shim_settings_error_gets_the_flags_up_calls_them() -> None:
    assert shim_flags_named("tls_cert and tls_key go together") == ["--shim-tls-cert", "--shim-tls-key"]
    assert shim_flags_named("workers must be at least 1, got 0") == ["--shim-workers"]
    assert shim_flags_named("cors_allow_origins holds 'x'; give scheme://host[:port]") == []


@pytest.mark.parametrize(
    ("host", "dialled"),
    [
        ("127.0.0.1", "127.0.0.1:5"),
        ("0.0.0.0", "127.0.0.1:5"),
        ("::", "[::1]:5"),
        ("::1", "[::1]:5"),
        ("localhost", "localhost:5"),
    ],
)
def test_the_shim_dials_a_wildcard_server_on_loopback(host: str, dialled: str) -> None:
    assert dial_address(host, 5) == dialled


def test_a_former_model_flag_reaches_the_server_in_its_new_spelling_and_up_warns_once() -> None:
    argv = split(["--lm-size", "small", "--model-options", "mlp.width=8", "--mlp-width", "64"])
    assert pairs(argv.server) == {"--model-options": "byte-lm.size=small,mlp.width=64,mlp.width=8"}
    assert argv.warnings == (
        "--lm-size is deprecated; use --model-options byte-lm.size=small",
        "--mlp-width is deprecated; use --model-options mlp.width=64",
    )
    assert split(["--model-options", "mlp.width=8"]).warnings == ()
