"""Stand-ins for the rollout tests: a small byte-level BPE tokenizer with the 8 tags as single tokens, a random tiny
Qwen2 model and a dict-backed retriever that records its calls. (The shared ``tiny_world`` fixture replaces these in
the end-to-end tests when it is available.)"""

from __future__ import annotations

import functools

import torch

from searchr1_lld.data import prompts as P

EOS, PAD = "<|endoftext|>", "<|pad|>"

DOCS = [
    {"id": "d1", "contents": '"Lake Varo"\nLake Varo is a lake in the north of Ostria, fed by the river Keln.'},
    {"id": "d2", "contents": '"Ostria"\nOstria is a country whose capital is Brelm, a city on the coast.'},
    {"id": "d3", "contents": '"Brelm"\nBrelm is the capital of Ostria and home of the Brelm Tower built in 1821.'},
    {"id": "d4", "contents": '"Keln"\nThe Keln is a river that flows from Mount Tor into Lake Varo.'},
]


@functools.lru_cache(maxsize=1)
def make_tokenizer():
    """Byte-level BPE (vocab ~600) trained on the prompt, observation and invalid-action texts; tags are added tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, trainers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    texts = [P.INSTRUCTION, P.INVALID_ACTION_MESSAGE, P.format_observation(DOCS)] + [d["contents"] for d in DOCS]
    texts += ["Question: where is Lake Varo? <think> I need to search </think> <search> Lake Varo </search>",
              "<answer> Brelm </answer> <answer> Ostria </answer> the capital of Ostria"] * 5
    tok = Tokenizer(BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=[EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in P.TAG_TOKENS])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD)
    for tag in P.TAG_TOKENS:
        assert len(hf.encode(tag, add_special_tokens=False)) == 1, tag
    return hf


def enc(text: str) -> list[int]:
    return make_tokenizer().encode(text, add_special_tokens=False)


def make_model(seed: int = 0, hidden: int = 32, layers: int = 2):
    """Random tiny Qwen2ForCausalLM over the stand-in tokenizer (fp32, eval mode)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = make_tokenizer()
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = Qwen2ForCausalLM(cfg)
    return model.eval()


class DictRetriever:
    """Ranks DOCS by word overlap with the query; records every call as (queries, topk)."""

    def __init__(self, docs=DOCS):
        self.docs = list(docs)
        self.calls: list[tuple[list[str], int]] = []

    def search(self, queries: list[str], topk: int) -> list[list[dict]]:
        self.calls.append((list(queries), topk))
        out = []
        for q in queries:
            words = set(q.lower().split())
            scored = sorted(self.docs, key=lambda d: -len(words & set(d["contents"].lower().split())))
            out.append([{"id": d["id"], "contents": d["contents"], "score": 1.0} for d in scored[:topk]])
        return out


def row(i: int, question: str = "Where is Lake Varo?", golds=("Ostria",)) -> dict:
    return {"id": f"q{i}", "question": question, "golden_answers": list(golds), "data_source": "test", "metadata": {}}


def test_stand_in_tokenizer_round_trips_tags():
    tok = make_tokenizer()
    ids = enc("<search> Lake Varo </search>")
    assert ids[0] == tok.convert_tokens_to_ids("<search>") and ids[-1] == tok.convert_tokens_to_ids("</search>")
    assert tok.decode(ids) == "<search> Lake Varo </search>"
