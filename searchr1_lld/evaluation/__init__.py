"""Evaluator: greedy Search-R1 rollouts on QA benchmarks -> EM per benchmark -> tables.

    checkpoint --> run_agent_loop(greedy=True, max 4 turns, top-3 docs) --> one record per question
               --> trajectories.jsonl (append-only, flushed per batch: the source of truth)
               --> results.json / results.md / results.csv (always recomputed from trajectories.jsonl)

Metrics of one dataset (``n`` questions, one greedy response each):
    em                  = mean_i EM(pred_i, golds_i)                       (SQuAD-normalised exact match)
    sub_em              = mean_i subEM(pred_i, golds_i)                    (a gold is a substring of the prediction)
    f1                  = mean_i max_g tokenF1(pred_i, g)
    mean_valid_searches = mean_i valid_searches_i
    mean_turns          = mean_i num_turns_i
    invalid_action_rate = sum_i invalid_actions_i / sum_i num_turns_i     (share of turns that were invalid actions)
    truncation_rate     = mean_i 1[truncated_i]                            (ran out of token budget)
    answer_rate         = mean_i 1[prediction_i is not None]
Datasets whose rows carry ``metadata.hops`` (the synthetic world's) also get em_single_hop / em_multi_hop (and their n).
Average over datasets (the paper's "Avg."): unweighted mean of the per-dataset EM.
Relative gain of a method over the base (the first row of a comparison): (avg_new - avg_base) / avg_base.

Resuming: a rerun reads trajectories.jsonl, skips every (dataset, id) already in it and appends only the rest; a
partial last line (a crash mid-write) is dropped. Each trajectories file has a ``*.provenance.json`` next to it: the
model (path + SHA-256 of its weight and config files), the tokenizer, the rows of every dataset (hashed), the decoding
settings and the retriever; a rerun whose provenance differs is refused (:func:`check_provenance`), so results of two
models or settings are never mixed. Sharding: ``shard=(i, k)`` evaluates rows i, i+k, i+2k, ... of every
dataset into ``trajectories.shard-i-of-k.jsonl``; :func:`merge_shards` combines the shard files and writes the tables.
Each shard process takes its own device and rendezvous port, and :func:`run_shards` starts the shards of one node
(shards.py).

Layout: metrics.py (records, metrics; pure), tables.py (markdown / CSV / results files), files.py (trajectories file,
provenance, shards), shards.py (shard processes: device, port, ``--gpus``), engines.py (one generation engine per
process for every checkpoint of a comparison), run.py (rows of each dataset, :func:`evaluate`, :func:`compare`),
paper_table.py (the paper's table over several runs, with the paper's quoted averages).
"""

from searchr1_lld.evaluation.engines import CheckpointEngines, checkpoint_weights
from searchr1_lld.evaluation.files import (DECODING_KEYS, MODEL_FILE_PATTERNS, TrajectoryLog, check_provenance,
                                           count_pending, drop_unused_provenance, eval_provenance, finalize,
                                           merge_shards, model_fingerprint, parse_shard, provenance_path, read_records,
                                           rows_sha256, sha256_file, shard_rows, trajectories_path)
from searchr1_lld.evaluation.metrics import (BENCHMARKS, DISPLAY_NAMES, KNOWN_DATASETS, RESULTS_CSV, RESULTS_JSON,
                                             RESULTS_MD, TRAJECTORIES, EvalError, average_em,
                                             dataset_metrics, dataset_name, parse_datasets, record_from_trajectory, relative_gain,
                                             summarize)
from searchr1_lld.evaluation.paper_table import PAPER_AVERAGE_EM, paper_config, paper_table, write_paper_table
from searchr1_lld.data.splits import fixed_subsample
from searchr1_lld.evaluation.run import (benchmark_rows, compare, distinct_labels, eval_rollout_config, evaluate,
                                         load_eval_rows, load_tokenizer, model_label, sampled_em)
from searchr1_lld.evaluation.shards import prepare_shard_process, run_shards, shard_device, shard_env
from searchr1_lld.evaluation.tables import (csv_table, detail_table, load_results, markdown_table, write_results,
                                            write_tables)

__all__ = [
    "DECODING_KEYS", "MODEL_FILE_PATTERNS", "TrajectoryLog", "check_provenance", "count_pending",
    "drop_unused_provenance", "eval_provenance",
    "finalize", "merge_shards", "model_fingerprint", "parse_shard", "provenance_path", "read_records", "rows_sha256",
    "sha256_file", "shard_rows", "trajectories_path", "BENCHMARKS", "DISPLAY_NAMES", "KNOWN_DATASETS", "RESULTS_CSV",
    "RESULTS_JSON", "RESULTS_MD", "TRAJECTORIES", "EvalError", "average_em", "dataset_metrics", "dataset_name",
    "parse_datasets", "record_from_trajectory", "relative_gain", "summarize", "benchmark_rows", "compare", "distinct_labels", "model_label",
    "eval_rollout_config", "evaluate", "fixed_subsample", "load_eval_rows", "load_tokenizer", "sampled_em", "csv_table", "detail_table",
    "load_results", "markdown_table", "write_results", "write_tables", "PAPER_AVERAGE_EM", "paper_config",
    "paper_table", "write_paper_table", "prepare_shard_process", "run_shards",
    "shard_device", "shard_env", "CheckpointEngines", "checkpoint_weights",
]
