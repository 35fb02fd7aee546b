"""FlashRAG preparation on FlashRAG-format fixture files (written here), and the hub path with load_dataset stubbed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchr1_lld.data import flashrag
from searchr1_lld.data.flashrag import EVAL_DATASETS, FlashRAGError

# split layout of the real collection: which splits each dataset ships
SPLITS = {"nq": ["train", "dev", "test"], "triviaqa": ["train", "dev", "test"], "popqa": ["test"],
          "hotpotqa": ["train", "dev"], "2wikimultihopqa": ["train", "dev"], "musique": ["train", "dev"],
          "bamboogle": ["test"]}


def _write_mirror(root: Path) -> Path:
    """A tiny FlashRAG-format mirror: <root>/<name>/<split>.jsonl with 3 rows each, varied raw shapes."""
    for name, splits in SPLITS.items():
        for split in splits:
            d = root / name
            d.mkdir(parents=True, exist_ok=True)
            rows = [
                {"id": f"{split}_0", "question": f"  who wrote the {name} book  ", "golden_answers": ["Ann Lee"],
                 "metadata": {"type": "bridge"}},
                {"id": f"{split}_1", "question": f"which year for {name}?", "golden_answers": ["1999", "'99"]},
                {"id": f"{split}_2", "question": "where is the river", "golden_answers": "Nile"},  # a bare string
            ]
            with open(d / f"{split}.jsonl", "w") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
    return root


@pytest.fixture
def mirror(tmp_path: Path) -> Path:
    return _write_mirror(tmp_path / "flashrag")


@pytest.mark.parametrize("name", EVAL_DATASETS)
def test_eval_rows_schema_for_each_benchmark(mirror: Path, name: str) -> None:
    rows = flashrag.load_eval_rows(name, local_dir=mirror)
    expected_split = "test" if "test" in SPLITS[name] else "dev"
    assert len(rows) == 3
    for r in rows:
        assert set(r) == {"id", "question", "golden_answers", "data_source", "metadata"}
        assert r["data_source"] == name
        assert r["metadata"]["split"] == expected_split
        assert r["id"].startswith(expected_split)
        assert r["question"].endswith("?") and r["question"] == r["question"].strip()
        assert isinstance(r["golden_answers"], list) and all(isinstance(g, str) for g in r["golden_answers"])
    assert rows[0]["question"] == f"who wrote the {name} book?"
    assert rows[1]["question"] == f"which year for {name}?"  # already ends with "?": unchanged
    assert rows[1]["golden_answers"] == ["1999", "'99"]
    assert rows[2]["golden_answers"] == ["Nile"]
    assert rows[0]["metadata"]["source_metadata"] == {"type": "bridge"}


def test_known_splits_match_the_paper() -> None:
    assert {n: flashrag.resolve_eval_split(n) for n in EVAL_DATASETS} == {
        "nq": "test", "triviaqa": "test", "popqa": "test", "hotpotqa": "dev", "2wikimultihopqa": "dev",
        "musique": "dev", "bamboogle": "test"}
    assert flashrag.resolve_eval_split("x", ["train", "dev"]) == "dev"
    assert flashrag.resolve_eval_split("x", ["dev", "test"]) == "test"
    with pytest.raises(FlashRAGError, match="neither a test nor a dev"):
        flashrag.resolve_eval_split("x", ["train"])


def test_train_mixes(mirror: Path) -> None:
    nq = flashrag.load_train_rows("nq", local_dir=mirror)
    mix = flashrag.load_train_rows("nq+hotpotqa", local_dir=mirror)
    assert [r["data_source"] for r in nq] == ["nq"] * 3
    assert [r["data_source"] for r in mix] == ["nq"] * 3 + ["hotpotqa"] * 3
    assert all(r["metadata"]["split"] == "train" for r in mix)
    with pytest.raises(FlashRAGError, match="unknown train mix"):
        flashrag.load_train_rows("nq+musique", local_dir=mirror)


def test_env_var_local_dir(mirror: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(flashrag.LOCAL_DIR_ENV, str(mirror))
    assert len(flashrag.load_eval_rows("bamboogle")) == 3


@pytest.mark.parametrize("bad, message", [
    ({"id": "a", "question": "", "golden_answers": ["x"]}, "empty 'question'"),
    ({"id": "a", "question": "q", "golden_answers": []}, "non-empty list"),
    ({"id": "a", "question": "q", "golden_answers": ["", None]}, "no non-empty answer"),
    ({"id": "a", "golden_answers": ["x"]}, "missing or empty 'question'"),
])
def test_bad_rows_are_named(bad: dict, message: str) -> None:
    with pytest.raises(FlashRAGError, match=message) as info:
        flashrag.convert([bad], "nq", "test")
    assert "nq/test row 0" in str(info.value)


def test_duplicate_ids_rejected() -> None:
    raw = [{"id": "1", "question": "a", "golden_answers": ["x"]}, {"id": "1", "question": "b", "golden_answers": ["y"]}]
    with pytest.raises(FlashRAGError, match="not unique"):
        flashrag.convert(raw, "nq", "test")


def test_missing_local_split_is_a_clear_error(mirror: Path) -> None:
    with pytest.raises(FlashRAGError, match=r"popqa/train.*available splits there: \['test'\]"):
        flashrag.load_split("popqa", "train", local_dir=mirror)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_prepare_writes_files_and_card(mirror: Path, tmp_path: Path, fmt: str) -> None:
    out = tmp_path / "out"
    card = flashrag.prepare(out, local_dir=mirror, train_mix="nq+hotpotqa", fmt=fmt, progress=False)
    assert card["counts"]["nq"] == {"train": 3, "test": 3}
    assert card["counts"]["hotpotqa"] == {"train": 3, "dev": 3}
    assert card["counts"]["musique"] == {"dev": 3}
    assert card["eval_splits"]["2wikimultihopqa"] == "dev" and card["eval_splits"]["popqa"] == "test"
    assert card["source_revision"].startswith("local:")
    assert json.loads((out / "data_card.json").read_text()) == card
    # one file per training set: the mix nq+hotpotqa is train/nq + train/hotpotqa, the mix nq is train/nq alone
    assert card["files"]["train/nq"] == f"train/nq.{fmt}" and card["files"]["test/musique"] == f"test/musique.{fmt}"
    train = [r for name in ("nq", "hotpotqa") for r in flashrag.load_rows(out / "train" / f"{name}.{fmt}")]
    assert train == flashrag.load_train_rows("nq+hotpotqa", local_dir=mirror)
    assert len(train) == 6 and train[0]["metadata"]["split"] == "train"
    bamboogle = flashrag.load_rows(out / "test" / f"bamboogle.{fmt}")
    assert bamboogle == flashrag.load_eval_rows("bamboogle", local_dir=mirror)  # lossless round trip


def test_cli(mirror: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rc = flashrag.main(["--out", str(tmp_path / "o"), "--local-dir", str(mirror), "--datasets", "nq", "musique",
                        "--train-mix", "nq", "--quiet"])
    assert rc == 0
    assert sorted(p.name for p in (tmp_path / "o" / "test").iterdir()) == ["musique.jsonl", "nq.jsonl"]
    assert json.loads(capsys.readouterr().out)["counts"]["musique"] == {"dev": 3}
    assert flashrag.main(["--out", str(tmp_path / "o2"), "--local-dir", str(mirror), "--datasets", "nope"]) == 2


def test_hub_path_calls_load_dataset(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub branch: load_dataset(repo, name, split=...) and the same conversion (stubbed: no network here)."""
    import datasets

    calls = []

    def fake_load_dataset(repo, name, split=None, revision=None):
        calls.append((repo, name, split, revision))
        return [{"id": "0", "question": "who is it", "golden_answers": ["x"]}]

    monkeypatch.delenv(flashrag.LOCAL_DIR_ENV, raising=False)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    rows = flashrag.load_eval_rows("hotpotqa")
    assert calls == [("RUC-NLPIR/FlashRAG_datasets", "hotpotqa", "dev", None)]
    assert rows == [{"id": "0", "question": "who is it?", "golden_answers": ["x"], "data_source": "hotpotqa",
                     "metadata": {"split": "dev", "source_metadata": None}}]


def test_hub_failure_explains_offline_use(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.delenv(flashrag.LOCAL_DIR_ENV, raising=False)
    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(FlashRAGError, match="--local-dir"):
        flashrag.load_eval_rows("nq")


def test_prepare_from_the_hub_pins_and_records_the_revision(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every split is loaded at the commit the hub reports first, and data_card.json records it (stubbed hub)."""
    import datasets
    import huggingface_hub

    calls = []

    class Api:
        def dataset_info(self, repo):
            return type("Info", (), {"sha": "0123abc"})()

    def fake_load_dataset(repo, name, split=None, revision=None):
        calls.append((name, split, revision))
        return [{"id": "0", "question": "who is it", "golden_answers": ["x"]}]

    monkeypatch.delenv(flashrag.LOCAL_DIR_ENV, raising=False)
    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    card = flashrag.prepare(tmp_path / "out", datasets=["bamboogle"], train_mix="nq", progress=False)
    assert calls == [("nq", "train", "0123abc"), ("bamboogle", "test", "0123abc")]
    assert card["source_revision"] == "RUC-NLPIR/FlashRAG_datasets@0123abc"
    assert sorted(card["files"]) == ["test/bamboogle", "train/nq"]
