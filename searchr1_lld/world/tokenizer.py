"""The synthetic world's tokenizer: byte-level BPE trained with ``tokenizers`` on the world's corpus and rendered
prompts/observations, with *Qwen's own* pre-tokenisation (regex split, byte-level without its own regex, NFC) so that
``AutoTokenizer`` -- which rebuilds a ``Qwen2Tokenizer`` from vocab + merges with exactly that pipeline -- gives
identical ids after reload. The 8 tags of ``prompts.TAG_TOKENS`` are single *added, non-special* tokens
(``skip_special_tokens`` keeps them); ``<|endoftext|>`` is eos, ``<|pad|>`` is pad. Every entity-name word is one
token (the tokenizer sees each many times), and every year of the corpus is one added token
(``WorldConfig.tokenizer_year_tokens``), so copying a name or a year from a passage is copying one or two tokens.
"""

from __future__ import annotations

import re
from pathlib import Path

from searchr1_lld.data.prompts import INVALID_ACTION_MESSAGE, TAG_TOKENS, format_observation, render_prompt
from searchr1_lld.world.generate import COMPANY_SUFFIXES, INDUSTRIES, OCCUPATIONS, passage_title

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"



def train_tokenizer(texts: list[str], vocab_size: int, out_dir: str | Path | None = None,
                    year_tokens: list[str] | tuple[str, ...] = ()):
    """Train the byte-level BPE tokenizer on ``texts``; return it as a ``Qwen2Tokenizer`` (saved to ``out_dir``).

    ``vocab_size``: BPE tokens + the tags. ``year_tokens`` (``corpus_years``) are added on top, each with its
    leading space (``" 1874"``, as a name word is ``" Mouxra"``), as single added non-special tokens like the tags:
    Qwen's pre-tokenisation splits numbers into digits, so a year would otherwise be a four-token copy for the tiny
    policy, a different and much less reliable circuit than a name's one-token copy (docs/lab.md).

    Pre-tokenisation is Qwen2's (``PRETOKENIZE_REGEX`` split + ByteLevel(use_regex=False) + NFC): the class
    ``AutoTokenizer`` picks for this directory rebuilds exactly this pipeline, so ids survive save/load.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

    if vocab_size < 256 + 2 + len(TAG_TOKENS):
        raise ValueError(f"tokenizer_vocab_size must be >= {256 + 2 + len(TAG_TOKENS)} (byte alphabet + specials)")
    tok = Tokenizer(BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                        byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(TAG_TOKENS), special_tokens=[EOS_TOKEN, PAD_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    tok.add_tokens([AddedToken(" " + y, special=False, normalized=False) for y in year_tokens])
    hf_tok = Qwen2Tokenizer(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, unk_token=None)
    check_tokenizer(hf_tok)
    if out_dir is not None:
        hf_tok.save_pretrained(str(out_dir))
    return hf_tok


def check_tokenizer(tokenizer) -> None:
    """Raise if a tag is not one non-special token or eos/pad are missing."""
    if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
        raise ValueError("tokenizer needs an eos and a pad token")
    for tag in TAG_TOKENS:
        ids = tokenizer.encode(tag, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"tag {tag!r} is not a single token: {ids}")
        if tag in tokenizer.all_special_tokens:
            raise ValueError(f"tag {tag!r} must be a non-special added token (skip_special_tokens would drop it)")


def tokenizer_training_texts(passages: list[dict], rows: list[dict]) -> list[str]:
    """Corpus passages, rendered prompts and observation blocks: the text the tokenizer will see in rollouts."""
    texts = [p["contents"] for p in passages]
    texts += [render_prompt(r["question"]) for r in rows]
    texts += [format_observation(passages[i:i + 3]) for i in range(0, len(passages), 3)]
    texts.append(INVALID_ACTION_MESSAGE)
    texts += [f"<think> look it up </think>\n<search> {r['metadata']['subject']} </search>" for r in rows]
    # every word of every entity name (the passage titles), many times over, with and without a leading space:
    # BPE then merges each whole name word into ONE token, so copying a name is copying one token per word
    name_words = sorted({w for p in passages for w in passage_title(p["contents"]).split()}
                        | set(OCCUPATIONS) | set(INDUSTRIES) | set(COMPANY_SUFFIXES))
    texts += [" ".join([w] * NAME_WORD_REPEATS) for w in name_words]
    texts += [w for w in name_words for _ in range(NAME_WORD_REPEATS // 4)]
    return texts


YEAR_PATTERN = r"\b([12]\d{3})\b"  # a four-digit year of the world (1000-2008) as a whole word


def corpus_years(texts: list[str]) -> list[str]:
    """The distinct four-digit years ``YEAR_PATTERN`` finds in ``texts`` (e.g. the corpus passages), sorted."""
    pattern = re.compile(YEAR_PATTERN)
    return sorted({m for t in texts for m in pattern.findall(t)})


NAME_WORD_REPEATS = 64  # occurrences of each name word in the tokenizer's training text




def one_token_share(tokenizer, words: list[str]) -> float:
    """Share of ``words`` that are one token after a space (``" Mouxra"``), as the policy copies a name word: a
    vocabulary too small for the corpus' names splits them, and copying a name becomes a multi-token circuit
    (NaN for no words)."""
    if not words:
        return float("nan")
    ids = tokenizer([" " + w for w in words], add_special_tokens=False)["input_ids"]
    return sum(len(x) == 1 for x in ids) / len(words)
