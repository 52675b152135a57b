"""The flags of `sluice up`, generated from the server's Settings and the shim's ShimSettings, and the process
each one belongs to: the command line of `up` split into the server's and the shim's.

Routing, shown by `--help` as three groups:
  server and shim  a setting both have with one meaning (SHARED: the keys file, the interface): to both;
  server           every other server setting, under its own name (`up` has always forwarded these);
  shim             every other shim setting; one whose name the server also uses (its HTTPS certificate,
                   its access log, its connection and message caps) is --shim-NAME, so the server's keeps
                   its name. The ports are --grpc-port and --http-port, the shim's processes --shim-workers.
The shim's --upstream is the server `up` started; with --tls-cert the shim speaks TLS to it and, unless
--upstream-ca names the CA, trusts exactly that certificate (gRPC takes a leaf as its own trust anchor).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from process.flags import FlagParser, add_flags, flag_name
from server.config import Settings
from server.former_flags import FORMER_FLAGS, add_former_flags, former_options
from shim.config import ShimSettings

Child = Literal["server", "shim"]
BOTH: tuple[Child, ...] = ("server", "shim")

# The same file, the same interface, the same collector: one flag, given to both.
SHARED = frozenset({"auth_keys", "host", "otlp_endpoint", "otlp_sampling_ratio"})
SET_BY_UP = frozenset({"upstream"})  # the shim's upstream is the server this command started
RENAMED: dict[tuple[Child, str], str] = {
    ("server", "port"): "grpc_port",
    ("shim", "port"): "http_port",
    ("shim", "workers"): "shim_workers",  # --workers would read as the server's (that is --frontends)
}
SHOWN_DEFAULTS: dict[tuple[Child, str], str] = {
    ("shim", "upstream_ca"): "the server's --tls-cert, pinned; plaintext without it",
}
GROUPS: dict[tuple[Child, ...], str] = {
    BOTH: "server and shim (given to both)",
    ("server",): "server (see sluice serve --help)",
    ("shim",): "shim (see sluice shim --help; a setting the server also names is --shim-NAME here)",
}


@dataclass(frozen=True, slots=True)
class Route:
    """One flag of `sluice up`: the field it sets in each child it goes to, and how it reads in --help."""

    dest: str  # up's flag as a name: shim_tls_cert is --shim-tls-cert
    field: str  # the settings field it sets in each child: tls_cert
    to: tuple[Child, ...]
    parse: Callable[[str], object]  # the children's own parser for the value
    metavar: str
    help: str

    @property
    def flag(self) -> str:
        return flag_name(self.dest)


@dataclass(frozen=True, slots=True)
class UpArgv:
    """The command lines of the two children; the shim's lacks --upstream (known once the server listens)."""

    server: tuple[str, ...]
    shim: tuple[str, ...]
    warnings: tuple[str, ...] = ()  # for flags given in a former spelling (the server gets the new one)


class _FlagSpecs(argparse.ArgumentParser):
    """What add_flags would add for each field (type, metavar, help), so `up` adds the same flags under its
    own names and groups: the flags stay generated from the settings, never restated here."""

    def __init__(self, settings_type: type[Any]) -> None:
        super().__init__(add_help=False)
        self.specs: dict[str, dict[str, Any]] = {}
        add_flags(self, settings_type)

    def add_argument(self, *names: Any, **kwargs: Any) -> argparse.Action:
        self.specs[kwargs["dest"]] = kwargs
        return super().add_argument(*names, **kwargs)


def routes() -> list[Route]:
    """Every flag of `sluice up`, server fields first, each in its settings class's order."""
    specs: dict[Child, dict[str, dict[str, Any]]] = {
        "server": _FlagSpecs(Settings).specs,
        "shim": _FlagSpecs(ShimSettings).specs,
    }
    names: dict[Child, dict[str, str]] = {"server": {}, "shim": {}}  # field -> up's dest
    for name in specs["server"]:
        names["server"][name] = RENAMED.get(("server", name), name)
    for name in specs["shim"]:
        if name in SHARED:
            names["shim"][name] = name
        elif name not in SET_BY_UP:
            clash = name in specs["server"]
            names["shim"][name] = RENAMED.get(("shim", name)) or (f"shim_{name}" if clash else name)
    out = []
    for child in ("server", "shim"):
        for name, dest in names[child].items():
            if child == "shim" and name in SHARED:
                continue  # routed with the server's field of that name
            to = BOTH if name in SHARED else (child,)
            helps = [_help(c, name, specs[c][name]["help"], names[c]) for c in to]
            text = (
                helps[0]
                if len(helps) == 1
                else "; ".join(f"{c}: {h}" for c, h in zip(to, helps, strict=True))
            )
            spec = specs[child][name]
            out.append(Route(dest, name, to, spec["type"], spec["metavar"], text))
    return out


def parser(prog: str = "sluice up") -> FlagParser:
    out = FlagParser(
        prog=prog,
        description="Run the Sluice gRPC server and the HTTP/SSE shim in front of it; each flag goes to the "
        "process it belongs to. With --tls-cert the shim reaches the server over TLS and trusts that "
        "certificate, or the CA --upstream-ca names (give it when the certificate is rotated: a pinned one "
        "stops matching). With --tls-client-ca give the shim --upstream-cert and --upstream-key.",
    )
    groups = {to: out.add_argument_group(title) for to, title in GROUPS.items()}
    for route in routes():
        groups[route.to].add_argument(
            route.flag,
            dest=route.dest,
            # The text is kept as given, for the children to parse again; checked here so that a mistake
            # names up's flag (--shim-max-connections, not the shim's --max-connections).
            type=_checked(route.parse),
            default=argparse.SUPPRESS,
            metavar=route.metavar,
            help=route.help,
        )
    add_former_flags(groups[("server",)])
    return out


def split(argv: Sequence[str], prog: str = "sluice up") -> UpArgv:
    """Each flag given to the children it goes to; raises FlagError for a flag that does not parse and
    ValueError for settings of the two that cannot work together."""
    given: dict[str, str] = vars(parser(prog).parse_args(argv))
    former, warnings = former_options(given)
    if former:  # given to the server as the --model-options entries they stand for, so it warns only here
        given["model_options"] = ",".join([*former, *filter(None, [given.get("model_options")])])
        for dest in FORMER_FLAGS:
            given.pop(dest, None)
    lines: dict[Child, list[str]] = {"server": [], "shim": []}
    values: dict[Child, dict[str, object]] = {"server": {}, "shim": {}}  # what each child will parse
    for route in routes():
        if route.dest in given:
            for child in route.to:
                lines[child] += [flag_name(route.field), given[route.dest]]
                values[child][route.field] = route.parse(given[route.dest])
    server, shim = values["server"], values["shim"]
    if shim.get("upstream_ca") is not None and server.get("tls_cert") is None:
        raise ValueError("--upstream-ca is what the shim trusts for the server's --tls-cert: give --tls-cert")
    if server.get("tls_cert") is not None and "upstream_ca" not in shim:
        lines["shim"] += ["--upstream-ca", given["tls_cert"]]
    if server.get("tls_client_ca") is not None and shim.get("upstream_cert") is None:
        raise ValueError(
            "--tls-client-ca asks every client for a certificate: give the shim one with --upstream-cert "
            "and --upstream-key"
        )
    return UpArgv(tuple(lines["server"]), tuple(lines["shim"]), warnings)


def _checked(parse: Callable[[str], object]) -> Callable[[str], str]:
    def check(text: str) -> str:
        parse(text)
        return text

    check.__name__ = getattr(parse, "__name__", "value")  # argparse names the type in its own messages
    return check


def _help(child: Child, field: str, text: str, names: dict[str, str]) -> str:
    """The child's help, naming its flags as `up` does (the shim's "--tls-cert" is --shim-tls-cert here)."""
    for name, dest in names.items():
        if name != dest:
            text = re.sub(rf"(?<![\w-]){flag_name(name)}(?![\w-])", flag_name(dest), text)
    if (child, field) in SHOWN_DEFAULTS:
        text = text[: text.rindex("(default:")] + f"(default: {SHOWN_DEFAULTS[child, field]})"
    return text


def shim_flags_named(message: str) -> list[str]:
    """The flags of `up` that a ShimSettings error names by field where `up` calls them otherwise
    ("tls_cert and tls_key go together": --shim-tls-cert, --shim-tls-key)."""
    found = []
    for route in routes():
        if "shim" in route.to and route.flag != flag_name(route.field):
            named = message.startswith(f"{route.field} ") or (
                "_" in route.field and re.search(rf"\b{route.field}\b", message)
            )
            if named:
                found.append(route.flag)
    return found
