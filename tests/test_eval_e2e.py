"""Evaluator end to end on the tiny world: real tokenizer, real retriever index (in-process; HTTP service in the slow
test), eval.py CLI with the tiny policy, and an oracle policy whose exact EM is known in advance."""

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
from searchr1_lld.config import RolloutConfig, load_config
from searchr1_lld.evaluation import command
from searchr1_lld.rewards import exact_match
from scripted_backends import ScriptedBackend

REPO = Path(__file__).resolve().parents[1]
LIMIT = 4


def _cli():
    spec = importlib.util.spec_from_file_location("eval_cli", REPO / "eval.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _args(world: Path, out: Path, *extra: str) -> list[str]:
    return ["--datasets", f"synthetic={world / 'qa' / 'test.jsonl'}", "--model", str(world / "model"), "--index",
            str(world / "index"), "--out", str(out), "--limit", str(LIMIT),
            "--batch-size", "4", "--no-progress", "--set", "rollout.max_tokens_per_turn=32", *extra]


def _check_outputs(out: Path, n: int) -> tuple[dict, list[dict]]:
    """The four output files exist, agree with each other, and EM equals a recount from trajectories.jsonl."""
    res = json.loads((out / ev.RESULTS_JSON).read_text())
    recs = ev.read_records(out / ev.TRAJECTORIES)
    assert len(recs) == n and len({r["id"] for r in recs}) == n
    m = res["datasets"]["synthetic"]
    assert m["n"] == n and m["n_single_hop"] + m["n_multi_hop"] == n
    recount = sum(exact_match(r["prediction"], r["golden_answers"]) for r in recs) / n
    assert m["em"] == pytest.approx(recount) and res["average_em"] == pytest.approx(recount)
    turns = sum(r["num_turns"] for r in recs)
    assert m["invalid_action_rate"] == pytest.approx(sum(r["invalid_actions"] for r in recs) / turns)
    for r in recs:
        assert r["question"] and r["golden_answers"] and r["response_text"]
        assert len(r["queries"]) == len(r["retrieved_ids"]) == r["valid_searches"]
        assert all(len(ids) == 3 for ids in r["retrieved_ids"])  # top-3 documents
        assert 1 <= r["num_turns"] <= 5  # 4 searches + the answer-only turn at most
    md = (out / ev.RESULTS_MD).read_text()
    assert re.search(r"\| Method \| synthetic \| Avg\. \|", md) and "em_multi_hop" in md  # NAME=PATH: reported as NAME
    assert (out / ev.RESULTS_CSV).read_text().splitlines()[0] == "Method,synthetic,Avg."
    return res, recs


def test_eval_cli_tiny_policy_and_resume(tiny_world, tmp_path, monkeypatch):
    cli = _cli()
    out = tmp_path / "eval"
    assert cli.main(_args(tiny_world, out)) == 0
    res, _ = _check_outputs(out, LIMIT)
    # rerun: every row is already there, no model or index is loaded, nothing is appended, same results
    def no_load(*a, **k):
        raise AssertionError("a finished evaluation must not load anything")

    import retriever

    from searchr1_lld.rollout import backends

    monkeypatch.setattr(backends, "make_backend", no_load)
    monkeypatch.setattr(retriever, "make_retriever", no_load)
    before = (out / ev.TRAJECTORIES).read_text()
    assert cli.main(_args(tiny_world, out)) == 0
    assert (out / ev.TRAJECTORIES).read_text() == before
    assert json.loads((out / ev.RESULTS_JSON).read_text())["average_em"] == res["average_em"]
    # another model into the same --out: refused (not the previous model's score), nothing loaded or changed
    import shutil

    other = tmp_path / "other-model"
    shutil.copytree(tiny_world / "model", other)
    weights = next(other.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert cli.main(_args(tiny_world, out, "--model", str(other))) == 2
    assert (out / ev.TRAJECTORIES).read_text() == before
    monkeypatch.undo()
    # compare mode: each checkpoint is evaluated into OUT/NAME, one table over them (gain relative to the first)
    policy = str(tiny_world / "model")
    cmp = tmp_path / "cmp"
    assert cli.main(_args(tiny_world, cmp, "--compare", f"first={policy}", f"again={policy}")) == 0
    first, again = (json.loads((cmp / n / ev.RESULTS_JSON).read_text()) for n in ("first", "again"))
    assert first["datasets"] == again["datasets"] == res["datasets"]  # greedy decoding is deterministic
    table = (cmp / ev.RESULTS_MD).read_text()
    assert "| first |" in table and "| again |" in table and "Gain" in table


def _oracle(tokenizer, rows):
    """Searches the question, then answers the gold for every other question and a wrong name otherwise."""
    info = tokenizer.convert_tokens_to_ids("<information>")
    answers = {r["question"]: (r["golden_answers"][0] if i % 2 == 0 else "Nobody Atall") for i, r in enumerate(rows)}

    def script(call, i, prompt):
        text = tokenizer.decode(prompt)
        question = next(q for q in answers if q in text)
        if prompt.count(info) >= 2:  # an observation came back (the instruction names <information> once)
            return tokenizer.encode(f"<think> found </think> <answer> {answers[question]} </answer>",
                                    add_special_tokens=False)
        return tokenizer.encode(f"<think> search </think> <search> {question} </search>", add_special_tokens=False)

    return script


def _oracle_eval(world: Path, out: Path, retriever) -> tuple[dict, list[dict]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(world / "tokenizer"))
    rows = ev.load_eval_rows([f"synthetic={world / 'qa' / 'test.jsonl'}"], limit=8)
    cfg = ev.eval_rollout_config(RolloutConfig(max_tokens_per_turn=64), max_turns=4, topk=3)
    res = ev.evaluate(rows, backend=ScriptedBackend(_oracle(tok, rows["synthetic"]), tok), tokenizer=tok,
                      retriever=retriever, rollout_cfg=cfg, out_dir=out, batch_size=3, progress=False)
    return res, _check_outputs(out, 8)[1]


def test_eval_oracle_policy_real_retriever(tiny_world, tmp_path):
    from retriever.inprocess import InProcessRetriever

    res, recs = _oracle_eval(tiny_world, tmp_path, InProcessRetriever(str(tiny_world / "index")))
    assert res["average_em"] == pytest.approx(0.5)  # gold for every other question
    m = res["datasets"]["synthetic"]
    assert (m["mean_valid_searches"], m["mean_turns"], m["invalid_action_rate"]) == (1.0, 2.0, 0.0)
    # the real index finds a supporting passage of most questions in the top 3
    rows = {r["id"]: r for r in ev.load_eval_rows([f"synthetic={tiny_world / 'qa' / 'test.jsonl'}"], limit=8)["synthetic"]}
    found = [bool(set(r["retrieved_ids"][0]) & set(rows[r["id"]]["metadata"]["support_ids"])) for r in recs]
    assert sum(found) >= len(found) // 2


@pytest.mark.slow
def test_eval_through_http_service(tiny_world, tmp_path):
    from retriever.client import RetrieverClient
    from retriever.inprocess import InProcessRetriever

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "retriever", "serve", "--index", str(tiny_world / "index"),
                             "--port", "0"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        url, deadline, seen = None, time.time() + 120, []
        while time.time() < deadline and url is None:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            m = re.search(r"retriever ready on (http://\S+)", line)
            url = m.group(1) if m else None
        assert url, "service did not start:\n" + "".join(seen)
        # same index, same oracle: the service returns exactly what the in-process retriever returns
        _, http_recs = _oracle_eval(tiny_world, tmp_path / "http", RetrieverClient(url))
        _, local_recs = _oracle_eval(tiny_world, tmp_path / "local", InProcessRetriever(str(tiny_world / "index")))
        assert [r["retrieved_ids"] for r in http_recs] == [r["retrieved_ids"] for r in local_recs]
        # the CLI with the tiny policy through the service, then compare mode over the two outputs
        cli = _cli()
        assert cli.main(_args(tiny_world, tmp_path / "cli", "--retriever-url", url)) == 0
        _check_outputs(tmp_path / "cli", LIMIT)
        assert cli.main(["--compare-dirs", str(tmp_path / "local"), str(tmp_path / "http"), "--out",
                         str(tmp_path / "cmp")]) == 0
        md = (tmp_path / "cmp" / ev.RESULTS_MD).read_text()
        assert "| local | 0.500 | 0.500 | base |" in md and "| http | 0.500 | 0.500 | +0.0% |" in md
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_eval_cli_through_a_service_started_with_a_token(tiny_world, tmp_path, monkeypatch):
    """eval.py builds its retriever client from the config's retriever section (timeouts, retries, bearer token):
    a service that requires a token answers it, and refuses a client without one."""
    import asyncio
    import threading

    import uvicorn

    from retriever import RetrieverError
    from retriever.inprocess import InProcessRetriever
    from retriever.service import ServiceSettings, bind_socket, create_app

    sock = bind_socket("127.0.0.1", 0)
    app = create_app(InProcessRetriever(str(tiny_world / "index")), ServiceSettings(token="s3cret"))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    try:
        deadline = time.time() + 60
        while not server.started and time.time() < deadline:
            time.sleep(0.05)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        cli = _cli()
        args = _args(tiny_world, tmp_path / "tok", "--retriever-url", url)
        # the client eval.py builds: the token from --retriever-token (or the config), no retries on a 401
        with_token = command.EvalOptions(**vars(cli.build_parser().parse_args([*args, "--retriever-token", "s3cret"])))
        built = command.retriever_of(load_config(None, ["retriever.max_retries=0", "retriever.timeout_s=7"]),
                                     with_token)["retriever"]
        assert (built.mode, built.url, built.token, built.max_retries, built.timeout_s) == ("http", url, "s3cret", 0, 7)
        monkeypatch.delenv("SEARCHR1_RETRIEVER_TOKEN", raising=False)
        assert cli.main([*args, "--retriever-token", "s3cret"]) == 0
        _, trajs = _check_outputs(tmp_path / "tok", LIMIT)
        assert any(t["valid_searches"] for t in trajs), "the policy made no search: the refusal below would go unseen"
        no_token = _args(tiny_world, tmp_path / "no-token", "--retriever-url", url)
        assert cli.main([*no_token, "--set", "retriever.max_retries=0", "rollout.max_tokens_per_turn=32"]) == 2  # 401
        assert cli.main(_args(tiny_world, tmp_path / "cfg", "--retriever-url", url, "--set",
                              "rollout.max_tokens_per_turn=32", "retriever.token=s3cret")) == 0  # token from config
        with pytest.raises(RetrieverError):
            import retriever as retrievers

            bare = command.EvalOptions(**vars(cli.build_parser().parse_args(args)))
            retrievers.make_retriever(command.retriever_of(
                load_config(None, ["retriever.max_retries=0"]), bare)["retriever"]).search(["who"], topk=1)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_eval_data_reads_search_r1_parquet_and_names_it_by_data_source(tiny_world, tmp_path):
    """eval.py --data FILE: Search-R1's test.parquet as it is (answers in reward_model.ground_truth.target, no id
    column), one benchmark named by its data_source; a checkpoint's name comes from its path without --name."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from searchr1_lld.data.jsonl import read_jsonl

    rows = read_jsonl(tiny_world / "qa" / "test.jsonl")[:LIMIT]
    data = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"data_source": "bamboogle", "question": r["question"], "prompt": [{"role": "user", "content": "unused"}],
         "reward_model": {"style": "rule", "ground_truth": {"target": r["golden_answers"]}},
         "extra_info": {"split": "test", "index": i}} for i, r in enumerate(rows)]), data)
    ckpt = tmp_path / "runs" / "tiny-x" / "checkpoints" / "step_000002" / "policy"
    import shutil

    shutil.copytree(tiny_world / "model", ckpt)
    out = tmp_path / "eval"
    assert _cli().main(["--data", str(data), "--model", str(ckpt), "--tokenizer", str(tiny_world / "tokenizer"),
                        "--index", str(tiny_world / "index"), "--out", str(out), "--batch-size", "4", "--no-progress",
                        "--set", "rollout.max_tokens_per_turn=32"]) == 0
    res = json.loads((out / ev.RESULTS_JSON).read_text())
    assert list(res["datasets"]) == ["bamboogle"] and res["datasets"]["bamboogle"]["n"] == LIMIT
    assert res["name"] == "tiny-x-step_000002"
    ids = [json.loads(line)["id"] for line in (out / ev.TRAJECTORIES).read_text().splitlines()]
    assert sorted(ids) == [f"bamboogle-test-{i}" for i in range(LIMIT)]
