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
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, Callable

import retriever as retrievers
from searchr1_lld import evaluation as ev
from searchr1_lld.cli import check_model_source, run_main
from searchr1_lld.config import load_config


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


def _check_counts(args: argparse.Namespace) -> None:
    """The count flags are in range (as the config's eval.* checks them): --limit >= 0 (0 = all), the rest >= 1."""
    for flag, value, least in (("--limit", args.limit, 0), ("--batch-size", args.batch_size, 1),
                               ("--max-turns", args.max_turns, 1), ("--topk", args.topk, 1)):
        if value is not None and value < least:
            raise ev.EvalError(f"{flag} must be >= {least}{' (0 = all)' if least == 0 else ''} (got {value})")


def _resolve(args: argparse.Namespace) -> dict[str, Any]:
    """Config + flags -> the settings of this evaluation (flags win over the config's eval section)."""
    _check_counts(args)
    cfg = load_config(args.config, args.set)
    e = cfg.eval
    if not (args.datasets or args.data or e.datasets):
        raise ev.EvalError("no dataset: --datasets or --data (or eval.datasets in --config)")
    named = ev.parse_datasets(args.datasets) if args.datasets else [] if args.data else ev.parse_datasets(e.datasets)
    from searchr1_lld.jsonl import read_rows

    file_rows = {f"{name}={f}": rows for f in args.data  # each --data file read once, here
                 for name, rows in _file_benchmarks(f, read_rows(f)).items()}
    datasets = ev.parse_datasets(named + list(file_rows))
    return {
        "cfg": cfg,
        "datasets": datasets,
        "file_rows": file_rows,
        "limit": e.limit if args.limit is None else args.limit,
        "batch_size": e.batch_size if args.batch_size is None else args.batch_size,
        "rollout_cfg": ev.eval_rollout_config(cfg.rollout, max_turns=args.max_turns or e.max_turns,
                                              topk=args.topk or e.topk),
        "template": args.template or cfg.data.prompt_template,
        "chat_template": args.chat_template or cfg.data.chat_template,
        "backend": args.backend or e.backend,
        "progress": not args.no_progress and cfg.logging.progress_bar,
    }


def _file_benchmarks(path: str, rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The benchmarks of a rows file, by name: one per ``data_source`` when every row has one (Search-R1's merged
    test.parquet holds all seven), else the whole file named by the file's name without suffix."""
    if rows and all(r.get("data_source") for r in rows):
        by_source: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            by_source.setdefault(str(r["data_source"]), []).append(r)
        return by_source
    return {Path(path).name.split(".")[0]: rows}


def _default_tokenizer(model_path: str, cfg: Any) -> str:
    """The model dir when it holds a tokenizer; a hub id (no such local path: a released checkpoint carries its
    tokenizer); else the config's model.tokenizer_path / model.path (a run's saved config.yaml names its base model);
    else the model path itself."""
    if Path(model_path).is_dir() and any((Path(model_path) / f).exists()
                                         for f in ("tokenizer.json", "tokenizer_config.json")):
        return model_path
    if not Path(model_path).exists():
        return model_path
    return cfg.model.tokenizer_path or cfg.model.path or model_path


def _retriever_config(cfg: Any, args: argparse.Namespace, index: str | None) -> Any:
    """The config's retriever section pointed at --retriever-url (timeouts, retries and the bearer token from the
    config; --retriever-token / $SEARCHR1_RETRIEVER_TOKEN override the token) or at the in-process --index."""
    rc = cfg.retriever
    if args.retriever_url:
        return dataclasses.replace(rc, mode="http", url=args.retriever_url, token=args.retriever_token or rc.token)
    if not index:
        raise ev.EvalError("need a retriever: --retriever-url URL or --index DIR")
    return dataclasses.replace(rc, mode="inprocess", index_dir=str(index))


def evaluate_checkpoint(model: str | None, out_dir: Path, name: str, s: dict[str, Any], args: argparse.Namespace,
                        get_retriever: Callable[[], Any], engines: dict[str, Any]) -> dict[str, Any] | None:
    """One checkpoint's evaluation into ``out_dir``; ``engines``: the process's engine, shared by the checkpoints of
    --compare (``CheckpointEngines``, built by the first that needs one)."""
    model_path = model or s["cfg"].model.path
    if not model_path:
        raise ev.EvalError("no model: --model (or model.path in --config)")
    tok_path = args.tokenizer or _default_tokenizer(model_path, s["cfg"])
    rows = ev.load_eval_rows(s["datasets"], limit=s["limit"], split=args.split, flashrag_dir=args.flashrag_dir,
                             file_rows=s["file_rows"])
    shard = ev.parse_shard(args.shard)
    provenance = ev.eval_provenance(model_path=model_path, tokenizer_path=tok_path, rows_by_dataset=rows,
                                    rollout_cfg=s["rollout_cfg"], template=s["template"], backend=s["backend"],
                                    dtype=s["cfg"].model.dtype, retriever=s["retriever_source"])
    ev.check_provenance(out_dir, shard, provenance, overwrite=args.overwrite)
    try:
        tokenizer = backend = retriever = None
        if ev.count_pending(rows, out_dir, shard):  # a finished (resumed) evaluation loads no model and no index
            tokenizer = ev.load_tokenizer(tok_path)
            engine_cfg = dataclasses.replace(s["rollout_cfg"], backend=s["backend"],
                                             generation_batch_size=s["batch_size"])
            # a shard takes its own device and port before its engine is built (shards of one node run side by side)
            device = ev.prepare_shard_process(shard) if shard is not None else "auto"
            if shard is not None:
                print(f"shard {shard[0]}/{shard[1]} on {device} (LOCAL_RANK={os.environ['LOCAL_RANK']}, "
                      f"MASTER_PORT={os.environ['MASTER_PORT']})", flush=True)
            if not engines:
                engines["engine"] = ev.CheckpointEngines(engine_cfg, dtype=s["cfg"].model.dtype, device=device)
            backend = engines["engine"].backend_for(model_path, tokenizer, tok_path)
            retriever = get_retriever()
        return ev.evaluate(rows, backend=backend, tokenizer=tokenizer, retriever=retriever,
                           rollout_cfg=s["rollout_cfg"], out_dir=out_dir, batch_size=s["batch_size"],
                           template=s["template"], chat_template=s["chat_template"], shard=shard, name=name,
                           progress=s["progress"])
    except BaseException:
        ev.drop_unused_provenance(out_dir, shard)  # failed before its first question: nothing to resume
        raise


def _main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    if args.compare_dirs:
        results = [ev.load_results(d) for d in args.compare_dirs]
        labels = ev.distinct_labels([r.get("name") or Path(d).name for r, d in zip(results, args.compare_dirs)],
                                    list(args.compare_dirs))
        print(ev.compare(list(zip(labels, results)), out, baseline=args.baseline, result_dirs=args.compare_dirs))
        return 0
    s = _resolve(args)
    from searchr1_lld.bookkeeping.tracking import quiet_library_output

    quiet_library_output()
    if args.gpus is not None:
        if args.shard or args.merge or args.compare:
            raise ev.EvalError("--gpus runs the shards itself: drop --shard / --merge / --compare")
        check_model_source(args.model or "", "--model")
        ev.run_shards(sys.argv[1:] if argv is None else argv, args.gpus, out, Path(__file__).resolve())
    if args.merge or args.gpus is not None:
        model = args.model or s["cfg"].model.path
        res = ev.merge_shards(out, order=s["datasets"], name=args.name or (ev.model_label(model) if model else ""))
        _log_wandb(args, s["cfg"], out, [(res["name"], res)])
        print(ev.markdown_table([(res["name"], res)]))
        return 0
    # a missing model dir is named now, not as a hub-id error after the index is loaded
    models = [("--model", args.model)]
    models += [(f"--compare {item.partition('=')[0]}", item.partition("=")[2]) for item in args.compare or []]
    for what, path in models:
        check_model_source(path or "", what)
    check_model_source(args.tokenizer or "", "--tokenizer", tokenizer=True)
    index = args.index or retrievers.retriever_mode(s["cfg"].retriever).index_dir(s["cfg"].retriever)
    s["retriever_source"] = args.retriever_url or (str(Path(index).resolve()) if index else "")
    cache: list[Any] = []
    engines: dict[str, Any] = {}  # one generation engine per process, for every checkpoint of --compare

    def get_retriever() -> Any:  # built on first use, shared by the checkpoints of --compare
        if not cache:
            cache.append(retrievers.make_retriever(_retriever_config(s["cfg"], args, index)))
        return cache[0]

    if args.compare:
        methods = []
        for item in args.compare:
            name, sep, path = item.partition("=")
            if not sep or not name or not path:
                raise ev.EvalError(f"--compare takes NAME=PATH items, got {item!r}")
            res = evaluate_checkpoint(path, out / name, name, s, args, get_retriever, engines)
            if res is None:
                raise ev.EvalError("--compare cannot be combined with --shard")
            methods.append((name, res))
        table = ev.compare(methods, out, baseline=args.baseline, result_dirs=[out / name for name, _ in methods])
        _log_wandb(args, s["cfg"], out, methods)
        print(table)
        return 0
    res = evaluate_checkpoint(args.model, out, args.name or ev.model_label(args.model or s["cfg"].model.path), s, args,
                              get_retriever, engines)
    if res is None:
        print(f"shard {args.shard} done -> {ev.trajectories_path(out, ev.parse_shard(args.shard))}; "
              f"merge with: python eval.py --merge --out {out}")
        return 0
    _log_wandb(args, s["cfg"], out, [(res["name"], res)])
    print((out / ev.RESULTS_MD).read_text())
    return 0


def _log_wandb(args: argparse.Namespace, cfg: Any, out: Path, methods: list[tuple[str, dict[str, Any]]]) -> None:
    """--wandb: the results as a wandb.Table in a run of their own (job type eval; resumed by the id in OUT)."""
    if not args.wandb:
        return
    from searchr1_lld.bookkeeping.tracking import init_wandb, log_eval_results

    settings = {"model": args.model or cfg.model.path, "datasets": list(methods[0][1]["datasets"]),
                "eval": dataclasses.asdict(cfg.eval), "max_turns": args.max_turns or cfg.eval.max_turns,
                "topk": args.topk or cfg.eval.topk}
    run = init_wandb(out, cfg.logging, settings, name=args.name or methods[0][0] or out.name, job_type="eval")
    if run is None:
        return
    try:
        log_eval_results(run, methods)
        print(f"wandb: results logged to run {run.id} ({getattr(run, 'url', None) or run.dir})")
    finally:
        run.finish()


def main(argv: list[str] | None = None) -> int:
    """The CLI; errors the user can fix -> one line on stderr and exit status 2 (tracebacks with --debug)."""
    return run_main(_main, argv, prog="eval.py")


if __name__ == "__main__":
    sys.exit(main())
