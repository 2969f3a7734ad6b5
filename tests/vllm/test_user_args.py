"""How `vllm serve`'s real parser records the options a command line sets (user_args.py: argparse's public API, no
compat entry)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser

from optimum_neuron_plugin.vllm.engine.user_args import USER_OPTIONS_KEY, record_user_options


def refuse_all_but_tp_2(model: Path, tp: int) -> None:
    if tp != 2:
        raise ValueError(f"tensor_parallel_size={tp} does not match the artifact's tp_degree=2 ({model.name})")


@pytest.fixture(scope="module")
def vllm_cli() -> tuple[FlexibleArgumentParser, FlexibleArgumentParser]:
    """The `vllm` command's parser with its `serve` subcommand, built as vllm.entrypoints.cli.main builds it."""
    cli = FlexibleArgumentParser(prog="vllm")
    serve = ServeSubcommand().subparser_init(cli.add_subparsers(required=False, dest="subparser"))
    record_user_options(serve, refuse_all_but_tp_2)
    return cli, serve


def recorded(cli: FlexibleArgumentParser, *options: str) -> dict:
    return cli.parse_args(["serve", "/models/llama", *options]).additional_config.get(USER_OPTIONS_KEY, {})


def test_serve_records_the_options_the_command_line_sets(vllm_cli):
    cli, _ = vllm_cli
    # 256 and 1 are what vLLM would pick when they are unset: explicit, they are still recorded.
    assert recorded(cli, "--max-num-seqs", "256", "-tp", "2", "--no-enable-chunked-prefill") == {
        "max_num_seqs": 256,
        "tensor_parallel_size": 2,
        "enable_chunked_prefill": False,
    }
    assert recorded(cli, "--max-num-seqs=1", "--dtype", "bfloat16") == {"max_num_seqs": 1, "dtype": "bfloat16"}


def test_serve_records_nothing_for_unset_options_and_keeps_vllms_defaults(vllm_cli):
    cli, serve = vllm_cli
    args = cli.parse_args(["serve", "/models/llama", "--port", "8001"])
    assert USER_OPTIONS_KEY not in args.additional_config
    assert (args.max_num_seqs, args.dtype, args.tensor_parallel_size) == tuple(
        serve.get_default(name) for name in ("max_num_seqs", "dtype", "tensor_parallel_size")
    )


def test_additional_config_keeps_the_users_keys_and_the_record(vllm_cli):
    cli, serve = vllm_cli
    mode = ["--additional-config", json.dumps({"prefill_mode": "serial"})]
    for options in ([*mode, "--max-num-seqs", "2"], ["--max-num-seqs", "2", *mode]):
        config = cli.parse_args(["serve", "/models/llama", *options]).additional_config
        assert config == {"prefill_mode": "serial", USER_OPTIONS_KEY: {"max_num_seqs": 2}}
    assert not serve.get_default("additional_config")  # the parser's default dict is never written


def test_a_refused_tensor_parallel_size_is_a_usage_error_of_vllm_serve(vllm_cli, capsys):
    cli, _ = vllm_cli
    with pytest.raises(SystemExit) as stopped:
        cli.parse_args(["serve", "/models/llama", "--tensor-parallel-size", "3"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "usage: vllm serve" in err
    assert "vllm serve: error: argument --tensor-parallel-size/-tp: tensor_parallel_size=3 does not match" in err


def test_without_exit_on_error_the_refusal_is_raised():
    parser = FlexibleArgumentParser(exit_on_error=False)
    parser.add_argument("model_tag")
    parser.add_argument("-tp", "--tensor-parallel-size", type=int)
    record_user_options(parser, refuse_all_but_tp_2)
    with pytest.raises(argparse.ArgumentError, match="tensor_parallel_size=4 does not match"):
        parser.parse_args(["/models/llama", "-tp", "4"])


def test_recording_twice_wraps_the_parser_once():
    parser = FlexibleArgumentParser()
    parser.add_argument("--max-num-seqs", type=int)
    record_user_options(parser, refuse_all_but_tp_2)
    record_user_options(parser, refuse_all_but_tp_2)
    assert parser.parse_args(["--max-num-seqs", "3"]).additional_config == {USER_OPTIONS_KEY: {"max_num_seqs": 3}}
    assert parser.parse_known_args.__wrapped__.__self__ is parser  # the class's method, not a wrapper
