"""Tests of verispec/bench/commands/flags.py: the generation flags made from the fields."""

from __future__ import annotations

import argparse

import attrs
import pytest

from verispec import cli
from verispec.bench.commands.flags import FLAGS, NOT_FLAGS, add_generation_options
from verispec.core.types import GenerationParams


def test_every_generation_config_field_is_a_flag_or_says_why_not() -> None:
    """Each field of GenerationParams is a generated flag or listed in NOT_FLAGS, not both."""
    fields = set(attrs.fields_dict(GenerationParams))
    assert set(FLAGS) | set(NOT_FLAGS) == fields
    assert not set(FLAGS) & set(NOT_FLAGS)


@pytest.mark.parametrize("command", [["bench"], ["generate", "--prompt", "x"]])
def test_the_flags_defaults_are_the_fields_defaults(command: list[str]) -> None:
    """Parsing no flag gives every generated flag its field's default, in both commands
    (the processing flags where the command has them)."""
    args = cli.build_parser().parse_args(command)
    defaults = GenerationParams()
    for name, flag in FLAGS.items():
        if flag.group == "processing" and command[0] == "bench":
            assert not hasattr(args, name)
            continue
        assert getattr(args, name) == getattr(defaults, name), name


def test_a_flag_accepts_what_its_field_accepts_at_the_edges() -> None:
    """The ranges come from the fields' checks: top_p takes 1 but not 0, min_p takes 0 but
    not 1, seed takes 2**64 - 1 but not 2**64, max_new_tokens takes 1 but not 0."""
    parser = cli.build_parser()
    parse = parser.parse_args
    good = ["--top-p", "1", "--min-p", "0", "--seed", str(2**64 - 1), "--max-new-tokens", "1"]
    args = parse(["bench", *good])
    assert (args.top_p, args.min_p, args.seed, args.max_new_tokens) == (1.0, 0.0, 2**64 - 1, 1)
    for flag, value in (("--top-p", "0"), ("--min-p", "1"), ("--seed", str(2**64)),
                        ("--max-new-tokens", "0")):  # fmt: skip
        with pytest.raises(SystemExit):
            parse(["bench", flag, value])


def test_flag_names_and_help_follow_the_field() -> None:
    """`top_k` is `--top-k`, and its help shows the field's default."""
    parser = argparse.ArgumentParser()
    add_generation_options(parser)
    action = next(a for a in parser._actions if a.dest == "top_k")
    assert action.option_strings == ["--top-k"]
    assert action.help is not None and action.help.endswith(f"(default {GenerationParams().top_k})")
