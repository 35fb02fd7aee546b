"""One declaration per command's options: train.py's and eval.py's parsers are generated from their typed options
(cli.option fields), so a flag and its field cannot drift apart."""

from __future__ import annotations

from dataclasses import dataclass, fields

import pytest

from searchr1_lld.cli import option, options_parser, parse_options
from searchr1_lld.evaluation.command import EvalOptions
from searchr1_lld.learner.command import TrainOptions


@pytest.mark.parametrize("cls", [TrainOptions, EvalOptions])
def test_the_parser_is_the_options_fields(cls):
    parser = options_parser(cls, None)
    dests = {a.dest for a in parser._actions if a.dest != "help"}
    assert dests == {f.name for f in fields(cls)}
    assert all(a.help for a in parser._actions)


def test_train_options_from_the_command_line():
    opts = parse_options(TrainOptions, ["--config", "c.yaml", "--allow-change", "trainer.total_steps",
                                        "--no-eval", "trainer.lr=1e-3"], None)
    assert (opts.config, opts.allow_change, opts.no_eval, opts.overrides) == ("c.yaml", ["trainer.total_steps"],
                                                                              True, ["trainer.lr=1e-3"])
    assert parse_options(TrainOptions, [], None).allow_change == []  # a fresh list each time
    assert parse_options(TrainOptions, [], None) == TrainOptions()


def test_eval_options_read_the_environment_when_parsed(monkeypatch):
    monkeypatch.setenv("SEARCHR1_RETRIEVER_URL", "http://127.0.0.1:9")
    opts = parse_options(EvalOptions, ["--out", "o", "--data", "a.jsonl", "b.parquet", "--limit", "3"], None)
    assert (opts.retriever_url, opts.data, opts.limit, opts.retriever_token) == ("http://127.0.0.1:9",
                                                                                ["a.jsonl", "b.parquet"], 3, None)
    with pytest.raises(SystemExit):  # --out is required; --backend takes a registered kind
        parse_options(EvalOptions, ["--backend", "hf"], None)
    with pytest.raises(SystemExit):
        parse_options(EvalOptions, ["--out", "o", "--backend", "tgi"], None)


def test_a_field_not_declared_as_an_option_is_refused():
    @dataclass
    class Loose:
        out: str = "x"

    with pytest.raises(TypeError, match="Loose.out: declare it with option"):
        options_parser(Loose, None)

    @dataclass
    class Declared:
        out: str = option("x", help="where")

    assert parse_options(Declared, ["--out", "y"], None).out == "y"
