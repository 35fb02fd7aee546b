"""The one reader of QA row files: the project's schema, and Search-R1's parquet files as its data scripts write them."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from searchr1_lld.data.jsonl import read_rows

PROMPT = [{"role": "user", "content": "Answer the given question. ... Question: who wrote hamlet?\n"}]


def _search_r1_row(i: int, with_flashrag_columns: bool) -> dict:
    """One row of Search-R1's train.parquet: FlashRAG's columns (when its script kept them) plus its own."""
    row = {"data_source": "nq", "prompt": PROMPT, "ability": "fact-reasoning",
           "reward_model": {"style": "rule", "ground_truth": {"target": [f"Shakespeare {i}", f"W. S. {i}"]}},
           "extra_info": {"split": "train", "index": i}}
    if with_flashrag_columns:
        row.update({"id": f"train_{i}", "question": f"who wrote hamlet {i}?", "golden_answers": [f"Shakespeare {i}"]})
    else:
        row["question"] = f"who wrote hamlet {i}?"
    return row


@pytest.mark.parametrize("with_flashrag_columns", [True, False])
def test_search_r1_parquet_reads_as_project_rows(tmp_path, with_flashrag_columns):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([_search_r1_row(i, with_flashrag_columns) for i in range(3)]), path)
    rows = read_rows(path)
    assert [r["question"] for r in rows] == [f"who wrote hamlet {i}?" for i in range(3)]
    if with_flashrag_columns:  # the file's own columns win
        assert [r["id"] for r in rows] == ["train_0", "train_1", "train_2"]
        assert rows[1]["golden_answers"] == ["Shakespeare 1"]
    else:  # golden answers from reward_model.ground_truth.target, ids from data_source / split / index
        assert [r["id"] for r in rows] == ["nq-train-0", "nq-train-1", "nq-train-2"]
        assert rows[1]["golden_answers"] == ["Shakespeare 1", "W. S. 1"]
    assert rows[0]["data_source"] == "nq"


def test_a_row_without_answers_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "q1", "question": "who?"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl: row 'q1' lacks \['golden_answers'\]"):
        read_rows(path)


def test_training_reads_search_r1_parquet(tmp_path):
    """data.source=files on Search-R1's parquet: the trainer's loader takes the rows as they are."""
    from searchr1_lld.config import load_config
    from searchr1_lld.learner.factories import load_train_rows

    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([_search_r1_row(i, False) for i in range(2)]), path)
    rows = load_train_rows(load_config(None, [f"data.train_files=[{path}]"]))
    assert [(r["id"], r["golden_answers"][0]) for r in rows] == [("nq-train-0", "Shakespeare 0"),
                                                                  ("nq-train-1", "Shakespeare 1")]
