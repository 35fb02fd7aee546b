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
import os
import sys
from pathlib import Path

from searchr1_lld.cli import run_main
from searchr1_lld.evaluation.command import EvalOptions, run_eval


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="checkpoint dir or hub id (default: model.path of the config)")
    p.add_argument("--tokenizer", help="tokenizer dir or hub id (default: the model's, else model.tokenizer_path)")
    p.add_argument("--datasets", help="comma list of nq,triviaqa,popqa,hotpotqa,2wikimultihopqa,musique,bamboogle, "
                                      "'all', or NAME=PATH rows files (default: eval.datasets of the config)")
    p.add_argument("--data", nargs="+", metavar="FILE", default=[],
                   help="rows files (JSONL/parquet: the project's, FlashRAG's or Search-R1's test.parquet): one "
                        "benchmark per data_source in a file (else per file, named by its file name); with "
                        "--datasets: both")
    p.add_argument("--split", help="dataset split (default: test, else dev)")
    p.add_argument("--flashrag-dir", help="local mirror of the FlashRAG files, DIR/<name>/<split>.jsonl "
                                          "(default: $FLASHRAG_LOCAL_DIR, else the HF hub)")
    p.add_argument("--retriever-url", default=os.environ.get("SEARCHR1_RETRIEVER_URL") or None,
                   help="retriever HTTP service (Search-R1 /retrieve protocol; default: $SEARCHR1_RETRIEVER_URL)")
    p.add_argument("--retriever-token", default=os.environ.get("SEARCHR1_RETRIEVER_TOKEN") or None,
                   help="bearer token of a service started with --token (default: $SEARCHR1_RETRIEVER_TOKEN, else "
                        "retriever.token of the config)")
    p.add_argument("--index", help="index dir for an in-process retriever (default: retriever.index_dir of the config)")
    p.add_argument("--out", required=True, help="output dir")
    p.add_argument("--name", default="", help="row label in the tables (default: from the model path, e.g. "
                                               "RUN-step_000100 for RUN/checkpoints/step_000100/policy)")
    p.add_argument("--config", help="YAML config whose rollout/data/eval settings apply (default: built-in defaults)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides, e.g. eval.topk=5")
    p.add_argument("--limit", type=int, help="first N questions of each dataset (0 = all)")
    p.add_argument("--batch-size", type=int, help="questions per agent-loop call")
    p.add_argument("--max-turns", type=int, help="search turns allowed (default eval.max_turns = 4)")
    p.add_argument("--topk", type=int, help="documents per search (default eval.topk = 3)")
    p.add_argument("--template", choices=["search-r1", "tiny"], help="prompt template (default: data.prompt_template)")
    p.add_argument("--chat-template", choices=["auto", "always", "never"],
                   help="wrap the prompt in the tokenizer's chat template (default: data.chat_template)")
    p.add_argument("--backend", choices=["hf", "vllm"], help="generation backend (default: hf)")
    p.add_argument("--shard", help="i/k: evaluate every k-th row starting at i into a shard file, on cuda:(i mod "
                                   "visible GPUs) (else the CPU) with its own MASTER_PORT unless one is set")
    p.add_argument("--gpus", type=int, metavar="N", help="run N shard processes on this node (shard i on cuda:i; "
                                                         "CPU processes without GPUs), then merge them")
    p.add_argument("--wandb", action="store_true",
                   help="log the results to wandb (table eval/results, summary eval/<dataset>/em and eval/avg_em) "
                        "with the config's logging.wandb_* settings; the run id is kept in OUT/wandb_run.json")
    p.add_argument("--merge", action="store_true", help="merge the shard files in --out and write the tables")
    p.add_argument("--compare", nargs="+", metavar="NAME=PATH", help="evaluate several checkpoints, one table")
    p.add_argument("--compare-dirs", nargs="+", metavar="DIR",
                   help="the paper's table from finished eval output dirs: rows = runs, the seven benchmarks + Avg., "
                        "relative gain, and the paper's average where docs/design.md quotes one (results.md, "
                        "results.csv, comparison.json in --out)")
    p.add_argument("--baseline", help="with --compare / --compare-dirs: the row the Gain column is relative to "
                                      "(default: the first)")
    p.add_argument("--overwrite", action="store_true",
                   help="delete earlier results in --out (of this shard) and start over, even if they came from "
                        "another model or other settings (without it such a rerun is refused)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (also: logging.progress_bar=false "
                                                               "in --config)")
    p.add_argument("--debug", action="store_true", help="show tracebacks of user errors too")
    return p


def main(argv: list[str] | None = None) -> int:
    """The CLI; errors the user can fix -> one line on stderr and exit status 2 (tracebacks with --debug)."""
    return run_main(lambda a: run_eval(EvalOptions(**vars(build_parser().parse_args(a))), a, Path(__file__).resolve()),
                    argv, prog="eval.py")


if __name__ == "__main__":
    sys.exit(main())
