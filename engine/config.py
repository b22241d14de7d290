"""Command-line flags from one dataclass: each field is a flag, its metadata the help text.

Unknown flags and wrong values fail loudly with one line and exit code 2 (never parse_known_args).
"""

from __future__ import annotations

import argparse
import dataclasses
import typing


class ConfigError(ValueError):
    """An impossible or unsupported configuration; the message says which flag to change."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def flag(default, help: str, choices: tuple | None = None):  # noqa: A002 - mirrors argparse
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


def build_parser(cls: type, prog: str, description: str) -> OneLineParser:
    parser = OneLineParser(prog=prog, description=description,
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind, meta = hints[f.name], f.metadata
        if kind is bool:
            parser.add_argument(f"--{f.name}", action=argparse.BooleanOptionalAction, default=f.default,
                                help=meta["help"])
        else:
            parser.add_argument(f"--{f.name}", type=kind, default=f.default, choices=meta.get("choices"),
                                help=meta["help"], metavar=None if meta.get("choices") else kind.__name__.upper())
    return parser


def parse(cls: type, argv: list[str] | None, prog: str, description: str):
    return cls(**vars(build_parser(cls, prog, description).parse_args(argv)))
