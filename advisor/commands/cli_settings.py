"""Command-line options generated from the settings' records, and the Request a command receives.

``settings_command(command, *classes)`` turns a function ``body(request)`` into a typer command whose
options are the flags of the given config dataclasses' settings (advisor.specs.setting) that the
command takes: a searched strategy setting is a pin on ``recommend`` ("pin the ..."), a boolean
setting is an on/off pair, and every option is None until given, so that the command knows what the
user said. The Request holds the values by field name; ``Request.values_of(cls)`` returns the settings
of one class that were given, as typed (advisor.commands.inputs.given_settings parses and checks them,
naming the flag).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional

import typer

from advisor.errors import AdvisorError
from advisor.families import MIXED, TRANSFORMER, Family, family, family_of_plan
from advisor.specs.setting import FIELD_DEFAULT, Setting, field_default, settings_of

# the dataclasses whose settings are the user's configuration (on/off pairs, None until given); any
# other class passed to settings_command holds a command's own options (plain flags)
_CONFIG = ("TrainingJob", "Strategy")


def _cli_type(s: Setting) -> type:
    if s.parse is not None or s.kind in ("text", "names", "custom"):
        return str
    if s.kind in ("positive_int", "non_negative_int"):
        return int
    if s.kind in ("positive_float", "non_negative_float", "fraction"):
        return float
    if s.kind == "boolean":
        return bool
    if s.kind == "choice":
        return type(s.choices[0])
    raise TypeError(f"no command-line type for setting kind {s.kind!r}")


def _help(command: str, s: Setting) -> str:
    return f"pin {s.help}" if command == "recommend" and s.search else s.help


def options_of(command: str, cls) -> list[tuple[str, Setting]]:
    """(field name, setting) of the class's settings that ``command`` takes on its command line."""
    return [(fl.name, s) for fl, s in settings_of(cls) if s.flags and command in s.commands]


def parameters(command: str, classes) -> list[inspect.Parameter]:
    out = []
    for cls in classes:
        config = cls.__name__ in _CONFIG
        for fl, s in settings_of(cls):
            if not s.flags or command not in s.commands:
                continue
            kind = _cli_type(s)
            if kind is bool and config:
                decls = tuple(f"{flag}/--no-{flag[2:]}" for flag in s.flags)
            else:
                decls = s.flags
            if config or s.cli_default is None:
                default = None
            elif s.cli_default is not FIELD_DEFAULT:
                default = s.cli_default
            else:
                default = field_default(fl)
            if command in s.required_on:
                default = ...
            annotation = Optional[kind] if default is None else kind
            option = typer.Option(default, *decls, help=_help(command, s), metavar=s.metavar or None)
            out.append(inspect.Parameter(fl.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation))
    return out


def settings_command(command: str, *classes) -> Callable[[Callable[["Request"], None]], Callable[..., None]]:
    """A typer command taking the flags of ``classes``' settings; the body receives a Request."""

    def decorate(body: Callable[[Request], None]) -> Callable[..., None]:
        params = parameters(command, classes)
        names = [p.name for p in params]
        if len(set(names)) != len(names):
            raise TypeError(f"{command}: two settings share a name")

        def run(**values: Any) -> None:
            return body(Request(command, values))

        run.__signature__ = inspect.Signature(params)       # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        run.__doc__, run.__name__ = body.__doc__, body.__name__
        return run

    return decorate


@dataclass(frozen=True)
class Request:
    """What the user gave a command: every option by field name (None where not given)."""

    command: str
    values: dict[str, Any]

    def get(self, name: str, default: Any = None) -> Any:
        value = self.values.get(name)
        return default if value is None else value

    def given(self, name: str) -> bool:
        """Whether the option was given: a setting is None until given; a command's own flag is false until
        given (an option with another default, --top or --searcher, is read with get)."""
        return self.values.get(name) not in (None, False)

    def values_of(self, cls) -> dict[str, Any]:
        """The settings of ``cls`` given on the command line, by field name, as typed (parsed and checked
        where they are used: advisor.commands.inputs.given_settings)."""
        return {name: self.values[name] for name, _ in options_of(self.command, cls)
                if self.values.get(name) is not None}

    def refuse(self, refused: dict[str, str]) -> None:
        """Refuse the first option given among ``refused`` (field name -> why, said after its flag)."""
        for name, why in refused.items():
            if self.given(name):
                raise AdvisorError(f"{flag_of(name)} {why}")


def flag_of(name: str) -> str:
    """The flag of a setting or command option, by field name (for messages)."""
    from advisor.commands.command_options import ALL_CLASSES

    for cls in ALL_CLASSES:
        for fl, s in settings_of(cls):
            if fl.name == name and s.flags:
                return s.flag
    return f"--{name.replace('_', '-')}"


def family_of_request(request: Request) -> Family:
    """Whose commands serve a request of estimate or recommend (advisor.families): the plan's family
    (--plan), a mixed cluster (--hardware PROFILE:NODES,...), or the family of the model (--model)."""
    plan = request.get("plan")
    if plan is not None:
        from advisor.plan import read_plan_dict

        return family_of_plan(read_plan_dict(plan))
    from advisor.specs.mixed import is_mixed

    if is_mixed(request.get("hardware")):
        return MIXED
    if request.get("model") is None:
        return TRANSFORMER        # its command names what is missing
    from advisor.specs.model import model_family

    return family(model_family(request.get("model")))
