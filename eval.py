r"""Evaluate Search-R1 checkpoints: greedy multi-turn rollouts -> EM per benchmark -> paper-style tables.

Examples
    # the synthetic world's test split, its index, its tiny policy (python -m searchr1_lld.world build --out .cache/world)
    python eval.py --model .cache/world/model --index .cache/world/index --template tiny \
        --datasets synthetic=.cache/world/qa/test.jsonl --out runs/eval-tiny
    # a trained checkpoint on the seven FlashRAG benchmarks through the retriever service (the run's own config.yaml
    # supplies the prompt template, rollout lengths, datasets and the tokenizer of its base model)
    python eval.py --model RUN/checkpoints/step_001005/policy --config RUN/config.yaml \
        --datasets all --retriever-url http://127.0.0.1:8000 --out RUN/eval
    # a released checkpoint of the authors (hub id or local copy) with the paper's protocol: Search-R1's prompt through
    # the model's chat template, greedy, 4 turns, top-3 e5 documents, the seven benchmarks
    python eval.py --model SEGAgentRL/LLDS-A-GRPO-Qwen2.5-7B-Ins --config configs/paper/eval.yaml \
        --retriever-url http://127.0.0.1:8000 --out runs/eval/LLDS-A-GRPO-Qwen2.5-7B-Ins
    # rows files as users have them (Search-R1's test.parquet, FlashRAG JSONL): one benchmark per data_source (the
    # merged test.parquet of Search-R1 holds all seven); the row label comes from the model path (RUN-step_001005)
    # unless --name is given
    python eval.py --model RUN/checkpoints/step_001005/policy --config RUN/config.yaml --data test.parquet \
        --retriever-url http://127.0.0.1:8000 --out RUN/eval
    # four GPUs of one node: four shard processes (shard i on cuda:i, its own port), then one merged result
    python eval.py ... --gpus 4 --out DIR
    # the same by hand (or on several nodes with a shared DIR), then merge
    for i in 0 1 2 3; do python eval.py ... --shard $i/4 & done; wait; python eval.py --merge --out DIR
    # log the results table to wandb (logging.wandb_* of --config: project, entity, group, tags, mode)
    python eval.py ... --wandb
    # compare checkpoints (evaluated here, into OUT/NAME) or finished eval dirs in the paper's table; gain is
    # relative to the first row or to --baseline; the paper's average next to the runs it quotes one for
    python eval.py --compare grpo=PATH1 llds=PATH2 --config RUN/config.yaml --out runs/cmp
    python eval.py --compare-dirs RUN_A/eval RUN_B/eval --baseline RUN_A-step_001005 --out runs/table

Outputs in --out: results.json, results.md, results.csv, trajectories.jsonl (resumable: finished rows are skipped)
and trajectories.provenance.json (model path + weights hash, data, decoding settings, retriever): a rerun into the
same --out resumes only when these match, otherwise it stops and lists the differences (--overwrite starts over).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from searchr1_lld.cli import options_parser, parse_options, run_main
from searchr1_lld.evaluation.command import EvalOptions, run_eval


def build_parser() -> argparse.ArgumentParser:
    """eval.py's parser, generated from :class:`EvalOptions` (its one declaration)."""
    return options_parser(EvalOptions, __doc__)


def main(argv: list[str] | None = None) -> int:
    """The CLI; errors the user can fix -> one line on stderr and exit status 2 (tracebacks with --debug)."""
    return run_main(lambda a: run_eval(parse_options(EvalOptions, a, __doc__), a, Path(__file__).resolve()),
                    argv, prog="eval.py")


if __name__ == "__main__":
    sys.exit(main())
