"""What ``eval.py`` does, as typed functions: its flags (:class:`EvalOptions`) resolved with the config into an
:class:`EvalPlan`, then one of its modes run by :func:`run_eval`: the paper's table from finished dirs
(--compare-dirs), shard processes and their merge (--gpus, --merge), several checkpoints in one table (--compare), or
one checkpoint (all or one shard of it). Flags win over the config's eval section."""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import retriever as retrievers
from searchr1_lld.bookkeeping.tracking import init_wandb, log_eval_results, quiet_library_output
from searchr1_lld.cli import check_model_source, option
from searchr1_lld.config import Config, ConfigError, RetrieverConfig, RolloutConfig, load_config
from searchr1_lld.evaluation.engines import CheckpointEngines
from searchr1_lld.evaluation.files import (check_provenance, count_pending, drop_unused_provenance, eval_provenance,
                                           merge_shards, parse_shard, trajectories_path)
from searchr1_lld.evaluation.metrics import RESULTS_MD, EvalError, parse_datasets
from searchr1_lld.evaluation.run import (compare, distinct_labels, eval_rollout_config, evaluate, load_eval_rows,
                                         load_tokenizer, model_label)
from searchr1_lld.evaluation.shards import prepare_shard_process, run_shards
from searchr1_lld.evaluation.tables import load_results, markdown_table
from searchr1_lld.data.jsonl import read_rows
from searchr1_lld.protocols import Retriever, Tokenizer
from searchr1_lld.data.prompts import TEMPLATES
from searchr1_lld.rollout.backends.base import GenerationBackend
from searchr1_lld.rollout.backends.kinds import BACKEND_KINDS, BackendKind, backend_kind

Rows = list[dict[str, Any]]
Result = dict[str, Any]


@dataclass(kw_only=True)
class EvalOptions:
    """eval.py's options, one field each: the declaration eval.py's parser is generated from (cli.option); None: not
    given."""

    model: Optional[str] = option(help="checkpoint dir or hub id (default: model.path of the config)")
    tokenizer: Optional[str] = option(help="tokenizer dir or hub id (default: the model's, else model.tokenizer_path)")
    datasets: Optional[str] = option(help="comma list of nq,triviaqa,popqa,hotpotqa,2wikimultihopqa,musique,"
                                          "bamboogle, 'all', or NAME=PATH rows files (default: eval.datasets of the "
                                          "config)")
    data: list[str] = option([], nargs="+", metavar="FILE",
                             help="rows files (JSONL/parquet: the project's, FlashRAG's or Search-R1's test.parquet): "
                                  "one benchmark per data_source in a file (else per file, named by its file name); "
                                  "with --datasets: both")
    split: Optional[str] = option(help="dataset split (default: test, else dev)")
    flashrag_dir: Optional[str] = option(help="local mirror of the FlashRAG files, DIR/<name>/<split>.jsonl "
                                              "(default: $FLASHRAG_LOCAL_DIR, else the HF hub)")
    retriever_url: Optional[str] = option(env="SEARCHR1_RETRIEVER_URL",
                                          help="retriever HTTP service (Search-R1 /retrieve protocol; default: "
                                               "$SEARCHR1_RETRIEVER_URL)")
    retriever_token: Optional[str] = option(env="SEARCHR1_RETRIEVER_TOKEN",
                                            help="bearer token of a service started with --token (default: "
                                                 "$SEARCHR1_RETRIEVER_TOKEN, else retriever.token of the config)")
    index: Optional[str] = option(help="index dir for an in-process retriever (default: retriever.index_dir of the "
                                       "config)")
    out: str = option(required=True, help="output dir")
    name: str = option("", help="row label in the tables (default: from the model path, e.g. RUN-step_000100 for "
                                "RUN/checkpoints/step_000100/policy)")
    config: Optional[str] = option(help="YAML config whose rollout/data/eval settings apply (default: built-in "
                                        "defaults)")
    set: list[str] = option([], nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. eval.topk=5")
    limit: Optional[int] = option(type=int, help="first N questions of each dataset (0 = all)")
    batch_size: Optional[int] = option(type=int, help="questions per agent-loop call")
    max_turns: Optional[int] = option(type=int, help="search turns allowed (default eval.max_turns = 4)")
    topk: Optional[int] = option(type=int, help="documents per search (default eval.topk = 3)")
    template: Optional[str] = option(choices=list(TEMPLATES), help="prompt template (default: data.prompt_template)")
    chat_template: Optional[str] = option(choices=["auto", "always", "never"],
                                          help="wrap the prompt in the tokenizer's chat template (default: "
                                               "data.chat_template)")
    backend: Optional[str] = option(choices=sorted(BACKEND_KINDS), help="generation backend (default: hf)")
    shard: Optional[str] = option(help="i/k: evaluate every k-th row starting at i into a shard file, on cuda:(i mod "
                                       "visible GPUs) (else the CPU) with its own MASTER_PORT unless one is set")
    gpus: Optional[int] = option(type=int, metavar="N", help="run N shard processes on this node (shard i on "
                                                             "cuda:i; CPU processes without GPUs), then merge them")
    wandb: bool = option(False, action="store_true",
                         help="log the results to wandb (table eval/results, summary eval/<dataset>/em and "
                              "eval/avg_em) with the config's logging.wandb_* settings; the run id is kept in "
                              "OUT/wandb_run.json")
    merge: bool = option(False, action="store_true", help="merge the shard files in --out and write the tables")
    compare: Optional[list[str]] = option(nargs="+", metavar="NAME=PATH",
                                          help="evaluate several checkpoints, one table")
    compare_dirs: Optional[list[str]] = option(nargs="+", metavar="DIR",
                                               help="the paper's table from finished eval output dirs: rows = runs, "
                                                    "the seven benchmarks + Avg., relative gain, and the paper's "
                                                    "average where docs/design.md quotes one (results.md, "
                                                    "results.csv, comparison.json in --out)")
    baseline: Optional[str] = option(help="with --compare / --compare-dirs: the row the Gain column is relative to "
                                          "(default: the first)")
    overwrite: bool = option(False, action="store_true",
                             help="delete earlier results in --out (of this shard) and start over, even if they came "
                                  "from another model or other settings (without it such a rerun is refused)")
    no_progress: bool = option(False, action="store_true",
                               help="no progress bars (also: logging.progress_bar=false in --config)")
    debug: bool = option(False, action="store_true", help="show tracebacks of user errors too")


@dataclass
class EvalPlan:
    """The settings of one evaluation: the config with the flags applied (:func:`resolve`), the one object every step
    of the evaluation reads (the flags themselves only choose what eval.py does: merge, shards, compare)."""

    cfg: Config
    datasets: list[str]  # dataset specs: names, NAME=PATH files
    file_rows: dict[str, Rows]  # the rows of each --data benchmark (``NAME=PATH`` -> rows), each file read once
    limit: int  # first N questions of each dataset (0 = all)
    batch_size: int  # questions per agent-loop call
    rollout_cfg: RolloutConfig  # the evaluation's turns and documents per search
    template: str
    chat_template: str
    backend: str  # the generation backend's name (rollout.backend of the engine)
    kind: BackendKind  # its kind, resolved (and its settings checked) once, when the plan is made
    progress: bool
    model: str  # the checkpoint (--model, else model.path; "" = none named)
    tokenizer: Optional[str]  # --tokenizer (None: the model's, else the config's)
    name: str  # --name: the row label ("" = from the model path)
    split: Optional[str]  # --split
    flashrag_dir: Optional[str]  # --flashrag-dir
    shard: Optional[tuple[int, int]]  # --shard i/k
    overwrite: bool  # --overwrite
    wandb: bool  # --wandb
    compare: list[str]  # --compare NAME=PATH items
    baseline: Optional[str]  # --baseline
    retriever: Optional[RetrieverConfig]  # the retriever to build on first use (None: neither a URL nor an index)
    retriever_source: str  # the service's URL or the index dir (provenance)


def check_counts(opts: EvalOptions) -> None:
    """The count flags are in range (as the config's eval.* checks them): --limit >= 0 (0 = all), the rest >= 1."""
    for flag, value, least in (("--limit", opts.limit, 0), ("--batch-size", opts.batch_size, 1),
                               ("--max-turns", opts.max_turns, 1), ("--topk", opts.topk, 1)):
        if value is not None and value < least:
            raise EvalError(f"{flag} must be >= {least}{' (0 = all)' if least == 0 else ''} (got {value})")


def resolve(opts: EvalOptions) -> EvalPlan:
    """Config + flags -> the settings of this evaluation (flags win over the config's eval section)."""
    check_counts(opts)
    cfg = load_config(opts.config, opts.set)
    e = cfg.eval
    backend = opts.backend or e.backend
    try:  # the engine's kind and its settings, before any rows file is read
        kind = backend_kind(dataclasses.replace(cfg.rollout, backend=backend))
    except ConfigError as err:
        raise ConfigError(f"{err} (the evaluation's engine: --backend, else eval.backend)") from None
    if not (opts.datasets or opts.data or e.datasets):
        raise EvalError("no dataset: --datasets or --data (or eval.datasets in --config)")
    named = parse_datasets(opts.datasets) if opts.datasets else [] if opts.data else parse_datasets(e.datasets)
    file_rows = {f"{name}={f}": rows for f in opts.data  # each --data file read once, here
                 for name, rows in file_benchmarks(f, read_rows(f)).items()}
    return EvalPlan(
        cfg=cfg, datasets=parse_datasets(named + list(file_rows)), file_rows=file_rows,
        limit=e.limit if opts.limit is None else opts.limit,
        batch_size=e.batch_size if opts.batch_size is None else opts.batch_size,
        rollout_cfg=eval_rollout_config(cfg.rollout, max_turns=opts.max_turns or e.max_turns,
                                        topk=opts.topk or e.topk),
        template=opts.template or cfg.data.prompt_template, chat_template=opts.chat_template or cfg.data.chat_template,
        backend=backend, kind=kind, progress=not opts.no_progress and cfg.logging.progress_bar,
        model=opts.model or cfg.model.path or "", tokenizer=opts.tokenizer, name=opts.name, split=opts.split,
        flashrag_dir=opts.flashrag_dir, shard=parse_shard(opts.shard), overwrite=opts.overwrite, wandb=opts.wandb,
        compare=list(opts.compare or []), baseline=opts.baseline, **retriever_of(cfg, opts))


def file_benchmarks(path: str, rows: Rows) -> dict[str, Rows]:
    """The benchmarks of a rows file, by name: one per ``data_source`` when every row has one (Search-R1's merged
    test.parquet holds all seven), else the whole file named by the file's name without suffix."""
    if rows and all(r.get("data_source") for r in rows):
        by_source: dict[str, Rows] = {}
        for r in rows:
            by_source.setdefault(str(r["data_source"]), []).append(r)
        return by_source
    return {Path(path).name.split(".")[0]: rows}


def default_tokenizer(model_path: str, cfg: Config) -> str:
    """The model dir when it holds a tokenizer; a hub id (no such local path: a released checkpoint carries its
    tokenizer); else the config's model.tokenizer_path / model.path (a run's saved config.yaml names its base model);
    else the model path itself."""
    if Path(model_path).is_dir() and any((Path(model_path) / f).exists()
                                         for f in ("tokenizer.json", "tokenizer_config.json")):
        return model_path
    if not Path(model_path).exists():
        return model_path
    return cfg.model.tokenizer_path or cfg.model.path or model_path


def retriever_of(cfg: Config, opts: EvalOptions) -> dict[str, Any]:
    """The plan's retriever: the config's retriever section pointed at --retriever-url (timeouts, retries and the
    bearer token from the config; --retriever-token / $SEARCHR1_RETRIEVER_TOKEN override the token) or at the
    in-process --index (else the config's index dir); None when there is neither (an error once one is needed), and
    its source for the provenance."""
    rc = cfg.retriever
    if opts.retriever_url:
        return {"retriever": dataclasses.replace(rc, mode="http", url=opts.retriever_url,
                                                 token=opts.retriever_token or rc.token),
                "retriever_source": opts.retriever_url}
    index = opts.index or retrievers.retriever_mode(rc).index_dir(rc)
    if not index:
        return {"retriever": None, "retriever_source": ""}
    return {"retriever": dataclasses.replace(rc, mode="inprocess", index_dir=str(index)),
            "retriever_source": str(Path(index).resolve())}


@dataclass
class Resources:
    """What the checkpoints of one eval.py call share: the retriever (built on first use) and the generation engine
    (one per process, ``CheckpointEngines``, built by the first checkpoint that needs one)."""

    make_retriever: Callable[[], Retriever]
    retriever: Optional[Retriever] = None
    engines: Optional[CheckpointEngines] = None

    def get_retriever(self) -> Retriever:
        if self.retriever is None:
            self.retriever = self.make_retriever()
        return self.retriever


def _engine_for(model_path: str, tok_path: str, tokenizer: Tokenizer, plan: EvalPlan,
                shared: Resources) -> GenerationBackend:
    """The process's engine holding ``model_path``; a shard takes its own device and port before its engine is built
    (shards of one node run side by side)."""
    engine_cfg = dataclasses.replace(plan.rollout_cfg, backend=plan.backend, generation_batch_size=plan.batch_size)
    shard = plan.shard
    device = prepare_shard_process(shard) if shard is not None else "auto"
    if shard is not None:
        print(f"shard {shard[0]}/{shard[1]} on {device} (LOCAL_RANK={os.environ['LOCAL_RANK']}, "
              f"MASTER_PORT={os.environ['MASTER_PORT']})", flush=True)
    if shared.engines is None:
        shared.engines = CheckpointEngines(engine_cfg, dtype=plan.cfg.model.dtype, device=device)
    return shared.engines.backend_for(model_path, tokenizer, tok_path)


def evaluate_checkpoint(model_path: str, out_dir: Path, name: str, plan: EvalPlan,
                        shared: Resources) -> Result | None:
    """The checkpoint ``model_path``'s evaluation into ``out_dir`` (None for one shard of it)."""
    if not model_path:
        raise EvalError("no model: --model (or model.path in --config)")
    tok_path = plan.tokenizer or default_tokenizer(model_path, plan.cfg)
    rows = load_eval_rows(plan.datasets, limit=plan.limit, split=plan.split, flashrag_dir=plan.flashrag_dir,
                          file_rows=plan.file_rows)
    shard = plan.shard
    provenance = eval_provenance(model_path=model_path, tokenizer_path=tok_path, rows_by_dataset=rows,
                                 rollout_cfg=plan.rollout_cfg, template=plan.template, backend=plan.backend,
                                 dtype=plan.cfg.model.dtype, retriever=plan.retriever_source)
    check_provenance(out_dir, shard, provenance, overwrite=plan.overwrite)
    try:
        tokenizer = backend = retriever = None
        if count_pending(rows, out_dir, shard):  # a finished (resumed) evaluation loads no model and no index
            tokenizer = load_tokenizer(tok_path)
            backend = _engine_for(model_path, tok_path, tokenizer, plan, shared)
            retriever = shared.get_retriever()
        return evaluate(rows, backend=backend, tokenizer=tokenizer, retriever=retriever, rollout_cfg=plan.rollout_cfg,
                        out_dir=out_dir, batch_size=plan.batch_size, template=plan.template,
                        chat_template=plan.chat_template, shard=shard, name=name, progress=plan.progress)
    except BaseException:
        drop_unused_provenance(out_dir, shard)  # failed before its first question: nothing to resume
        raise


def log_wandb(plan: EvalPlan, out: Path, methods: list[tuple[str, Result]]) -> None:
    """--wandb: the results as a wandb.Table in a run of their own (job type eval; resumed by the id in OUT)."""
    if not plan.wandb:
        return
    settings = {"model": plan.model, "datasets": list(methods[0][1]["datasets"]),
                "eval": dataclasses.asdict(plan.cfg.eval), "max_turns": plan.rollout_cfg.max_turns,
                "topk": plan.rollout_cfg.topk}
    run = init_wandb(out, plan.cfg.logging, settings, name=plan.name or methods[0][0] or out.name, job_type="eval")
    if run is None:
        return
    try:
        log_eval_results(run, methods)
        print(f"wandb: results logged to run {run.id} ({getattr(run, 'url', None) or run.dir})")
    finally:
        run.finish()


def compare_dirs(opts: EvalOptions, out: Path) -> int:
    """--compare-dirs: the paper's table from finished eval output dirs."""
    dirs = opts.compare_dirs or []
    results = [load_results(d) for d in dirs]
    labels = distinct_labels([r.get("name") or Path(d).name for r, d in zip(results, dirs)], list(dirs))
    print(compare(list(zip(labels, results)), out, baseline=opts.baseline, result_dirs=dirs))
    return 0


def shards_and_merge(opts: EvalOptions, plan: EvalPlan, out: Path, argv: list[str], script: Path) -> int:
    """--gpus: run the shard processes of this node, then merge; --merge: merge the shard files in ``out``."""
    if opts.gpus is not None:
        if opts.shard or opts.merge or opts.compare:
            raise EvalError("--gpus runs the shards itself: drop --shard / --merge / --compare")
        check_model_source(opts.model or "", "--model")
        run_shards(argv, opts.gpus, out, script)
    res = merge_shards(out, order=plan.datasets, name=plan.name or (model_label(plan.model) if plan.model else ""))
    log_wandb(plan, out, [(res["name"], res)])
    print(markdown_table([(res["name"], res)]))
    return 0


def prepare_checkpoints(opts: EvalOptions, plan: EvalPlan) -> Resources:
    """Each model and tokenizer named by a flag checked now (a missing dir is named before the index is loaded); the
    retriever of the plan, built on first use."""
    models = [("--model", opts.model)]
    models += [(f"--compare {item.partition('=')[0]}", item.partition("=")[2]) for item in plan.compare]
    for what, path in models:
        check_model_source(path or "", what)
    check_model_source(plan.tokenizer or "", "--tokenizer", tokenizer=True)
    return Resources(lambda: retrievers.make_retriever(needed_retriever(plan)))


def needed_retriever(plan: EvalPlan) -> RetrieverConfig:
    """The plan's retriever, once one is needed (an evaluation with questions left to roll out)."""
    if plan.retriever is None:
        raise EvalError("need a retriever: --retriever-url URL or --index DIR")
    return plan.retriever


def compare_checkpoints(plan: EvalPlan, out: Path, shared: Resources) -> int:
    """--compare NAME=PATH ...: each checkpoint into OUT/NAME, one table."""
    methods = []
    for item in plan.compare:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise EvalError(f"--compare takes NAME=PATH items, got {item!r}")
        res = evaluate_checkpoint(path, out / name, name, plan, shared)
        if res is None:
            raise EvalError("--compare cannot be combined with --shard")
        methods.append((name, res))
    table = compare(methods, out, baseline=plan.baseline, result_dirs=[out / name for name, _ in methods])
    log_wandb(plan, out, methods)
    print(table)
    return 0


def run_eval(opts: EvalOptions, argv: list[str] | None, script: Path) -> int:
    """eval.py with these flags (``argv``: the command line the shard processes of --gpus repeat; ``script``: the
    entry script they run); 0 when done."""
    out = Path(opts.out)
    if opts.compare_dirs:
        return compare_dirs(opts, out)
    plan = resolve(opts)
    quiet_library_output()
    if opts.merge or opts.gpus is not None:
        return shards_and_merge(opts, plan, out, sys.argv[1:] if argv is None else argv, script)
    shared = prepare_checkpoints(opts, plan)
    if plan.compare:
        return compare_checkpoints(plan, out, shared)
    res = evaluate_checkpoint(plan.model, out, plan.name or model_label(plan.model), plan, shared)
    if res is None:
        print(f"shard {opts.shard} done -> {trajectories_path(out, plan.shard)}; "
              f"merge with: python eval.py --merge --out {out}")
        return 0
    log_wandb(plan, out, [(res["name"], res)])
    print((out / RESULTS_MD).read_text())
    return 0
