"""Random-weight Llama GGUF files of larger shapes, for scaling benchmarks that radixlm and llama.cpp both load.

    python benchmarks/make_gguf.py [--sizes 0.5b 1.5b 3b] [--types Q4_0 Q4_1 Q8_0] [--out ../models]

Shapes are Llama-3.2-like (grouped-query attention, SwiGLU, tied embeddings); the tokenizer, its vocabulary
(49,152 tokens) and chat template are the embedded SmolLM2's, so prompts tokenize the same everywhere.
Weights are small random normals: the outputs are noise, the speed is a real model's of that shape.
Writes OUT/random-SIZE-TYPE.gguf (skipping files that exist). IQ3_XXS, IQ2_XXS / XS / S and IQ1_S, which llama.cpp's tool writes
only with an importance matrix, are random grid blocks (random bytes, d set so the weights are ~0.02; the table Q8_0).
The `gguf` package cannot write K-quants or the other IQ types; the benchmarks' files of them (Q2_K, Q3_K_M, Q4_K_M, Q5_K_M, IQ4_XS: mixes of those types with wider
ones, as llama.cpp chooses them) come from a Q4_0 file through llama.cpp's own tool (built by
peers/setup_llamacpp.sh), one TYPE at a time:

    ../peers/llama-quantize --allow-requantize ../models/random-1.5b-Q4_0.gguf ../models/random-1.5b-TYPE.gguf TYPE
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

SHAPES = {  # hidden, layers, intermediate, heads, kv heads (head dim = hidden / heads)
    "0.5b": (1024, 32, 4096, 16, 4),
    "1.5b": (2048, 24, 8192, 32, 8),
    "3b": (3072, 28, 8192, 24, 8),
}


def parameters(size: str, vocab: int) -> int:
    hidden, layers, inter, heads, kv = SHAPES[size]
    head = hidden // heads
    per_layer = 2 * hidden * hidden + 2 * hidden * kv * head + 3 * hidden * inter + 2 * hidden
    return layers * per_layer + vocab * hidden + hidden


TOKENIZER_FIELDS = {  # GGUF key -> the GGUFWriter method that writes it
    "tokenizer.ggml.model": "add_tokenizer_model", "tokenizer.ggml.pre": "add_tokenizer_pre",
    "tokenizer.ggml.tokens": "add_token_list", "tokenizer.ggml.token_type": "add_token_types",
    "tokenizer.ggml.merges": "add_token_merges", "tokenizer.chat_template": "add_chat_template",
}


def copy_tokenizer(writer, source) -> None:
    """The SmolLM2 file's tokenizer fields, as they are."""
    for key, field in source.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = field.contents()
        if key in TOKENIZER_FIELDS:
            getattr(writer, TOKENIZER_FIELDS[key])(value)
        elif key.endswith("_token_id"):
            writer.add_uint32(key, int(value))
        elif isinstance(value, bool):
            writer.add_bool(key, value)


RANDOM_BLOCKS = {"IQ3_XXS": (23, 1.5e-4), "IQ2_XXS": (19, 4e-4), "IQ2_XS": (20, 1e-3), "IQ2_S": (28, 1e-3),
                 "IQ1_S": (24, 3e-3)}  # -> llama.cpp's file type, the blocks' d
FILE_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, **{t: f for t, (f, _) in RANDOM_BLOCKS.items()}}


def write(path: str, size: str, qtype: str, source, seed: int = 0) -> None:
    import gguf

    hidden, layers, inter, heads, kv = SHAPES[size]
    head = hidden // heads
    vocab = len(source.fields["tokenizer.ggml.tokens"].data)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(f"random-llama-{size}")
    w.add_context_length(8192)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(head)
    w.add_file_type(FILE_TYPES[qtype])
    copy_tokenizer(w, source)
    kind = getattr(gguf.GGMLQuantizationType, qtype)

    def tensor(name: str, rows: int, cols: int, quantized: bool = True) -> None:
        if qtype in RANDOM_BLOCKS and name.startswith("blk."):  # grid blocks: any bytes decode, d (first) set
            per_block, size = gguf.GGML_QUANT_SIZES[kind]
            raw = rng.integers(0, 256, size=(rows * cols // per_block, size), dtype=np.uint8)
            raw[:, 0:2] = np.full(raw.shape[0], RANDOM_BLOCKS[qtype][1], dtype=np.float16).view(np.uint8).reshape(-1, 2)
            w.add_tensor(name, raw.reshape(rows, -1), raw_dtype=kind)
            return
        data = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float32)
        if quantized:
            table = gguf.GGMLQuantizationType.Q8_0 if qtype in RANDOM_BLOCKS else kind
            w.add_tensor(name, gguf.quants.quantize(data, table), raw_dtype=table)
        else:
            w.add_tensor(name, data)

    tensor("token_embd.weight", vocab, hidden, quantized=True)
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        tensor(f"blk.{i}.attn_q.weight", heads * head, hidden)
        tensor(f"blk.{i}.attn_k.weight", kv * head, hidden)
        tensor(f"blk.{i}.attn_v.weight", kv * head, hidden)
        tensor(f"blk.{i}.attn_output.weight", hidden, heads * head)
        tensor(f"blk.{i}.ffn_gate.weight", inter, hidden)
        tensor(f"blk.{i}.ffn_up.weight", inter, hidden)
        tensor(f"blk.{i}.ffn_down.weight", hidden, inter)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    import gguf

    from radixlm.runtime.model.sources import default_model_path

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--types", nargs="+", default=["Q4_0", "Q4_1", "Q8_0"], choices=list(FILE_TYPES))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "models"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    source = gguf.GGUFReader(default_model_path())
    vocab = len(source.fields["tokenizer.ggml.tokens"].data)
    for size in args.sizes:
        for qtype in args.types:
            path = os.path.join(args.out, f"random-{size}-{qtype}.gguf")
            if os.path.exists(path):
                print(f"{path}: exists")
                continue
            t = time.perf_counter()
            write(path + ".part", size, qtype, source)
            os.replace(path + ".part", path)
            print(f"{path}: {parameters(size, vocab) / 1e9:.2f}B parameters, {os.path.getsize(path) / 2**30:.2f} GiB, "
                  f"{time.perf_counter() - t:.0f} s")


if __name__ == "__main__":
    main()
