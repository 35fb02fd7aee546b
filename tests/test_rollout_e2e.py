"""End to end on the tiny world: the warm-started tiny Qwen2 through HFBackend, the real retriever service on
loopback (a subprocess), learner-side log-probs vs engine log-probs, and a retriever that dies mid-rollout."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
import queue
import re
import subprocess
import sys
import threading

import pytest
import torch

from searchr1_lld.data import prompts as P
from searchr1_lld.config import RolloutConfig
from searchr1_lld.rewards import exact_match
from searchr1_lld.rollout import run_agent_loop, to_batch
from searchr1_lld.rollout.agent_loop import ObservationTokenizer
from searchr1_lld.rollout.backends.hf import HFBackend
from scripted_backends import ScriptedBackend

pytestmark = pytest.mark.slow

CFG = RolloutConfig(max_turns=2, max_tokens_per_turn=48, max_obs_length=160, max_total_length=1024, topk=2,
                    temperature=0.9)


@pytest.fixture(scope="module")
def server(tiny_world):
    """``python -m retriever serve --port 0`` on the world's index; yields (process, url)."""
    proc = subprocess.Popen([sys.executable, "-m", "retriever", "serve", "--index", str(tiny_world / "index"),
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    url, seen = None, []
    try:
        while url is None:
            line = lines.get(timeout=180)
            seen.append(line)
            m = re.search(r"retriever ready on (http://\S+)", line)
            url = m.group(1) if m else None
    except queue.Empty:
        proc.kill()
        pytest.fail(f"retriever service did not start: {''.join(seen)[-2000:]}")
    yield proc, url
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=30)


def _client(url):
    from retriever.client import RetrieverClient

    return RetrieverClient(url, timeout_s=10.0, max_retries=1, backoff_s=0.05)


class ForcedFirstSearch:
    """The test world's tiny policy is barely warm-started and rarely closes a tag, so the first turn is forced:
    ``<think> .. </think> <search> QUESTION </search>`` per prompt, with the model's own teacher-forced log-probs
    (log_softmax(logits / T)); every later turn is sampled by the HFBackend with its KV cache."""

    def __init__(self, hf: HFBackend, tokenizer, rows, template="tiny"):
        from searchr1_lld.rollout.agent_loop import encode_prompt

        self.hf, self.calls = hf, 0
        self.forced = {tuple(encode_prompt(tokenizer, r["question"], template)):
                       tokenizer.encode(f"<think> I should search. </think>\n<search> {r['question']} </search>",
                                        add_special_tokens=False) for r in rows}

    def generate(self, prompts, *, max_new_tokens, stop_strings, temperature, top_p, greedy):
        from searchr1_lld.rollout.backends.base import GenerationOutput

        self.calls += 1
        if self.calls > 1:
            return self.hf.generate(prompts, max_new_tokens=max_new_tokens, stop_strings=stop_strings,
                                    temperature=temperature, top_p=top_p, greedy=greedy)
        outs = []
        for p in prompts:
            gen = self.forced[tuple(p)]
            with torch.no_grad():
                logits = self.hf.model(input_ids=torch.tensor([p + gen])).logits[0].float()
            lp = torch.log_softmax(logits[len(p) - 1 : -1] / temperature, -1).gather(-1, torch.tensor(gen)[:, None])
            outs.append(GenerationOutput(gen, lp.squeeze(-1).tolist(), "stop"))
        return outs


def test_rollout_with_tiny_model_and_real_service(server, tiny_world, tiny_tokenizer, tiny_model, world_rows):
    _, url = server
    model = tiny_model.float().eval()
    rows = world_rows[:6]
    backend = ForcedFirstSearch(HFBackend(model, tiny_tokenizer, batch_size=64, seed=0), tiny_tokenizer, rows)
    client = _client(url)
    timings: dict = {}
    trajs = run_agent_loop(rows, backend=backend, tokenizer=tiny_tokenizer, retriever=client, cfg=CFG, n=2,
                           timings=timings)
    assert len(trajs) == 12 and [t.group_id for t in trajs] == [i // 2 for i in range(12)]
    assert all(t.valid_searches >= 1 for t in trajs) and all(t.num_turns >= 2 for t in trajs)
    observe = ObservationTokenizer(tiny_tokenizer, CFG.max_obs_length)
    invalid = tiny_tokenizer.encode(P.INVALID_ACTION_MESSAGE, add_special_tokens=False)
    corpus_ids = {json.loads(line)["id"] for line in open(Path(tiny_world) / "corpus.jsonl")}
    for t in trajs:
        t.check()
        assert t.queries[0] == t.row["question"] and set(sum(t.retrieved_ids, [])) <= corpus_ids
        assert t.finish_reason in ("answer", "max_turns", "truncated", "length")
        assert t.num_turns <= CFG.max_turns + 1 and t.valid_searches <= CFG.max_turns
        assert len(t.prompt_ids) + len(t.response_ids) <= CFG.max_total_length
        assert t.reward == exact_match(t.prediction, t.row["golden_answers"])
        # observation segments are exactly the tokenised observations of the recorded searches
        obs_segments, start = [], None
        for i, m in enumerate(t.response_mask + [1]):
            if m == 0 and start is None:
                start = i
            elif m == 1 and start is not None:
                obs_segments.append(t.response_ids[start:i])
                start = None
        expected = [observe(h) for h in client.search(t.queries, CFG.topk)]
        assert [s for s in obs_segments if s != invalid] == expected
        assert len(obs_segments) == t.valid_searches + t.invalid_actions - (t.finish_reason != "answer")

    # learner side: one fp32 forward over to_batch output reproduces the engine's sampling log-probs
    batch = to_batch(trajs, tiny_tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids).logits.float()
    P_, T = batch.prompt_length, batch.response_length
    logp = torch.log_softmax(logits[:, P_ - 1 : P_ - 1 + T] / CFG.temperature, -1)
    logp = logp.gather(-1, batch.responses[..., None]).squeeze(-1)
    diff = ((logp - batch.engine_logprobs).abs() * batch.response_mask).max().item()
    print(f"\nmax |learner logp - engine logp| over {int(batch.response_mask.sum())} generated tokens: {diff:.3e}; "
          f"timings {timings}")
    assert batch.has_engine_logprobs and diff < 1e-4


def test_retriever_service_dying_mid_rollout_raises_a_clear_error(server, tiny_tokenizer, world_rows):
    from retriever.client import RetrieverError

    proc, url = server
    client = _client(url)
    search = tiny_tokenizer.encode("<search> the capital </search>", add_special_tokens=False)

    class KillAfterFirstCall:
        calls = 0

        def search(self, queries, topk):
            if self.calls == 1:  # the service dies between the first and the second turn
                proc.kill()
                proc.wait(timeout=30)
            self.calls += 1
            return client.search(queries, topk)

    backend = ScriptedBackend(lambda call, i, prompt: search, tiny_tokenizer)
    with pytest.raises(RetrieverError, match="unavailable") as info:
        run_agent_loop(world_rows[:2], backend=backend, tokenizer=tiny_tokenizer, retriever=KillAfterFirstCall(),
                       cfg=dataclasses.replace(CFG, max_turns=3))
    assert any("rollout turn 1" in note for note in info.value.__notes__)
    assert len(backend.calls) == 2  # the rollout stopped at the failing step
