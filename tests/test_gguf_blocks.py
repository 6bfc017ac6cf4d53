"""GGUF's quantized types as radixlm's int4 / int5 / int6 / int8 blocks (runtime/model/gguf_blocks.py), against the
`gguf` package's own dequantization: exact types bit for bit (Q6_K up to gguf's own float32 rounding), Q4_K and
Q5_K up to float16 rounding of their scales, the rest within their requantization step; and a file that mixes widths (as Q4_K_M files do) runs
each matrix at its own width, fused, close to its float weights."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from radixlm.kernels import cpu_ext
from radixlm.kernels import cpu_matmul as ck
from radixlm.runtime.engine import Engine
from radixlm.runtime.model.gguf_blocks import QuantBlocks
from radixlm.runtime.model.gguf_file import GGUFModel
from radixlm.runtime.model.loader import load_model, resolve_quantization

# where a block's float16 super-scales sit (byte offsets), so random blocks decode to weights of ~0.02
SCALE_AT = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q3_K": (108,), "Q2_K": (80, 82), "IQ4_NL": (0,),
            "IQ4_XS": (0,), "IQ3_S": (0,), "IQ3_XXS": (0,), "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,),
            "IQ1_S": (0,), "TQ2_0": (64,), "TQ1_0": (52,), "IQ1_M": ()}  # IQ1_M: its d in the scales' top nibbles


def random_blocks(qtype: str, n: int, k: int, seed: int = 0, scale: float = 1e-3) -> np.ndarray:
    """Random bytes in ``qtype``'s block layout for an [n, k] weight, super-scales set to float16s up to
    ``scale``."""
    kind = gguf.GGMLQuantizationType[qtype]
    per_block, size = gguf.GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n * k // per_block, size), dtype=np.uint8)
    for at in SCALE_AT[qtype]:
        scales = rng.uniform(scale / 10, scale, size=raw.shape[0]).astype(np.float16)
        raw[:, at:at + 2] = scales.view(np.uint8).reshape(-1, 2)
    return raw.reshape(n, -1)


def reference(raw: np.ndarray, qtype: str, n: int, k: int) -> torch.Tensor:
    kind = gguf.GGMLQuantizationType[qtype]
    return torch.from_numpy(np.asarray(gguf.quants.dequantize(raw, kind), dtype=np.float32).reshape(n, k).copy())


@pytest.mark.parametrize(("qtype", "bits"), [("Q4_K", 4), ("Q5_K", 5)])
def test_k_quants_load_at_their_width_up_to_float16_rounding_of_their_scales(qtype, bits):
    raw = random_blocks(qtype, 48, 512)
    blocks, want = QuantBlocks.from_gguf(raw, qtype, [48, 512]), reference(raw, qtype, 48, 512)
    top = 2**bits - 1
    assert blocks.bits == bits and blocks.q.dtype == torch.uint8 and int(blocks.q.max()) == top
    got = blocks.dequantize()
    # w = (d sc) q + (-dmin m), each product rounded to float16: at most 2^-11 of it, relative
    bound = (blocks.d.float().abs() * top + blocks.m.float().abs()).repeat_interleave(32, dim=1) * 2**-11
    assert ((got - want).abs() <= bound + 1e-9).all()


@pytest.mark.parametrize(("qtype", "bits"), [("Q4_0", 4), ("Q4_1", 4), ("Q5_0", 5), ("Q5_1", 5), ("Q8_0", 8)])
def test_legacy_types_load_exactly(qtype, bits):
    """gguf quantizes these itself; Q5_0's w = d (q - 16) is an int5 code with minimum -16 d."""
    w = torch.randn(32, 256, generator=torch.Generator().manual_seed(1)).numpy() * 0.05
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType[qtype])
    blocks = QuantBlocks.from_gguf(raw, qtype, [32, 256])
    assert blocks.bits == bits
    assert torch.equal(blocks.dequantize(), reference(raw, qtype, 32, 256))
    if qtype == "Q5_0":  # as int8 (an embedding table, or --quantization int8): codes q - 16, still exact
        assert torch.equal(blocks.to_bits(8).dequantize(), reference(raw, qtype, 32, 256))


def test_q6_k_loads_exactly_as_int6():
    """w = d sc (q - 32): radixlm multiplies (q - 32) sc (exact) by d, one rounding; gguf rounds (d sc) (q - 32),
    so the two agree to float32's last bit."""
    raw = random_blocks("Q6_K", 32, 512, seed=7)
    blocks, want = QuantBlocks.from_gguf(raw, "Q6_K", [32, 512]), reference(raw, "Q6_K", 32, 512)
    assert blocks.bits == 6 and blocks.m is None and blocks.sub.dtype == torch.int8 and blocks.sub.shape == (32, 32)
    assert blocks.d.shape == (32, 2) and int(blocks.q.max()) == 63 and int(blocks.q.min()) == 0
    got = blocks.dequantize()
    assert ((got - want).abs() <= want.abs() * 2**-23).all()
    rows = torch.tensor([3, 0, 31])
    assert torch.equal(blocks.take_rows(rows).dequantize(), got[rows])
    eight = blocks.to_bits(8)  # an 8-bit form (a qkv stacked with 4-bit q and k): within half an int8 step
    groups = got.view(32, 16, 32)
    assert ((eight.dequantize() - got).view(32, 16, 32).abs().amax(-1) <= groups.abs().amax(-1) / 254 * 1.01).all()
    with pytest.raises(ValueError, match="int6"):
        QuantBlocks.from_float(got, 6)


def test_q2_k_loads_exactly_as_int2():
    """Q2_K's own form, w = d sc q - dmin m with q in [0, 3] and 4-bit sc, m per 16: the file's values (gguf's
    dequantization bit for bit), through the native int2 layout too; with another width it requantizes (int8)."""
    raw = random_blocks("Q2_K", 32, 512, seed=8)
    want = reference(raw, "Q2_K", 32, 512)
    blocks = QuantBlocks.from_gguf(raw, "Q2_K", [32, 512])
    assert blocks.bits == 2 and blocks.kq.sc.shape == (32, 32) and int(blocks.q.max()) <= 3
    assert torch.equal(blocks.dequantize(), want)
    kq = blocks.kq
    codes, d, mn = ck.pack_int2(blocks.q, kq.sc, kq.m, kq.d, kq.dmin)
    assert torch.equal(ck.dequantize_subblocks(codes, d, mn), want)
    assert torch.equal(QuantBlocks.stack([blocks, blocks]).dequantize(), torch.cat([want, want]))
    four = QuantBlocks.from_gguf(random_blocks("Q4_K", 32, 512), "Q4_K", [32, 512])
    assert QuantBlocks.stack([blocks, four]).bits == 8
    assert [b.bits for b in QuantBlocks.stack_runs([blocks, blocks, four])] == [2, 4]
    with pytest.raises(ValueError, match="int3"):
        blocks.to_bits(3)


def test_q3_k_loads_exactly_as_int3_and_as_int6():
    """Q3_K's own form, w = d sc (q - 4) with q in [0, 7]: the codes, scales and d as the file holds them (gguf's
    dequantization bit for bit), through the native int3 layout too; its codes are int6 codes q + 28."""
    raw = random_blocks("Q3_K", 32, 512, seed=4)
    want = reference(raw, "Q3_K", 32, 512)
    blocks = QuantBlocks.from_gguf(raw, "Q3_K", [32, 512])
    assert blocks.bits == 3 and blocks.m is None and blocks.sub.shape == (32, 32) and blocks.d.shape == (32, 2)
    assert int(blocks.q.max()) <= 7 and -32 <= int(blocks.sub.min()) and int(blocks.sub.max()) <= 31
    assert torch.equal(blocks.dequantize(), want)
    assert torch.equal(blocks.to_bits(6).dequantize(), want)
    assert torch.equal(QuantBlocks.stack([blocks, blocks.to_bits(6)]).dequantize(), torch.cat([want, want]))
    codes, d = ck.pack_int3(blocks.q, blocks.sub, blocks.d)
    assert torch.equal(ck.dequantize_subblocks(codes, d), want)
    with pytest.raises(ValueError, match="int3"):
        QuantBlocks.from_gguf(random_blocks("Q4_K", 16, 256), "Q4_K", [16, 256]).to_bits(3)


def test_a_stack_of_widths_takes_the_widest_unless_told():
    four = QuantBlocks.from_gguf(random_blocks("Q4_K", 16, 256), "Q4_K", [16, 256])
    six = QuantBlocks.from_gguf(random_blocks("Q6_K", 16, 256, seed=3), "Q6_K", [16, 256])
    both = QuantBlocks.stack([four, six])  # int6 is Q6_K's own form, which 4-bit codes do not fit: int8
    want = torch.cat([four.dequantize(), six.dequantize()])
    assert both.bits == 8 and both.shape == (32, 256)
    assert (both.dequantize() - want).abs().max() <= want.abs().max() / 254 * 1.01
    assert QuantBlocks.stack([four, four]).bits == 4 and QuantBlocks.stack([four, six], bits=4).bits == 4
    sixes = QuantBlocks.stack([six, six])
    assert sixes.bits == 6 and torch.equal(sixes.dequantize(), torch.cat([six.dequantize()] * 2))
    with pytest.raises(ValueError, match="int6"):
        QuantBlocks.stack([four, six], bits=6)
    assert torch.equal(QuantBlocks.stack([four, four]).dequantize(), torch.cat([four.dequantize()] * 2))
    five = QuantBlocks.from_gguf(random_blocks("Q5_K", 16, 256, seed=5), "Q5_K", [16, 256])
    widened = QuantBlocks.stack([four, five])  # 4-bit codes are 5-bit codes: exact
    assert widened.bits == 5 and torch.equal(widened.dequantize(), torch.cat([four.dequantize(), five.dequantize()]))


def test_stack_runs_keep_the_last_width_apart():
    """A Q4_K_M qkv (Q4_K q, k, Q6_K v) -> [int4 q k, int6 v]: every part at its own width, exactly; parts of one
    width -> one stack; only the parts before the last run are stacked by the widest-width rule."""
    four, five, six = (QuantBlocks.from_gguf(random_blocks(t, 16, 256, seed=s), t, [16, 256])
                       for t, s in (("Q4_K", 0), ("Q5_K", 5), ("Q6_K", 3)))
    head, tail = QuantBlocks.stack_runs([four, four, six])
    assert (head.bits, tail.bits, head.shape, tail.shape) == (4, 6, (32, 256), (16, 256))
    assert head.kq is not None and torch.equal(torch.cat([head.dequantize(), tail.dequantize()]),
                                               torch.cat([four.dequantize()] * 2 + [six.dequantize()]))
    assert [b.bits for b in QuantBlocks.stack_runs([four, five, five])] == [4, 5]
    assert [b.bits for b in QuantBlocks.stack_runs([six, four, four])] == [6, 4]
    assert [b.bits for b in QuantBlocks.stack_runs([four, six, four])] == [8, 4]  # the head widens as stack does
    (one,) = QuantBlocks.stack_runs([five, five, five])
    assert one.bits == 5 and one.shape == (48, 256)


def write_mixed_file(path: str, embedding: str = "Q8_0", base: str = "Q4_K") -> None:
    """A 2-layer Llama (hidden 256, head dim 64) laid out as llama.cpp's Q4_K_M: ``base`` (Q4_K; Q3_K as in Q3_K_M
    files) matrices, Q6_K for layer 0's v and down (Q5_K in layer 1, as Q5_K_M files have), an ``embedding``
    embedding (tied)."""
    hidden, inter, heads, kv, vocab = 256, 512, 4, 2, 320
    w = gguf.GGUFWriter(path, "llama")
    for add, value in [(w.add_context_length, 512), (w.add_embedding_length, hidden), (w.add_block_count, 2),
                       (w.add_feed_forward_length, inter), (w.add_head_count, heads), (w.add_head_count_kv, kv),
                       (w.add_layer_norm_rms_eps, 1e-5), (w.add_vocab_size, vocab)]:
        add(value)
    emb = torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(4)).numpy() * 0.05
    table = gguf.quants.quantize(emb, gguf.GGMLQuantizationType[embedding]) if embedding in ("Q8_0", "Q5_0") else \
        random_blocks(embedding, vocab, hidden, 99, 1e-4)  # gguf cannot quantize to K-quants itself
    w.add_tensor("token_embd.weight", table, raw_dtype=gguf.GGMLQuantizationType[embedding])
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    shapes = {"attn_q": (hidden, hidden), "attn_k": (kv * 64, hidden), "attn_v": (kv * 64, hidden),
              "attn_output": (hidden, hidden), "ffn_gate": (inter, hidden), "ffn_up": (inter, hidden),
              "ffn_down": (hidden, inter)}
    for i in range(2):
        for name in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{name}.weight", np.ones(hidden, dtype=np.float32))
        for j, (name, (n, k)) in enumerate(shapes.items()):
            qtype = ("Q6_K" if i == 0 else "Q5_K") if name in ("attn_v", "ffn_down") else base
            w.add_tensor(f"blk.{i}.{name}.weight", random_blocks(qtype, n, k, 10 * i + j, 1e-4),
                         raw_dtype=gguf.GGMLQuantizationType[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.skipif(not cpu_ext.available(), reason="radixlm's CPU kernels did not build")
@pytest.mark.parametrize(("base", "width", "code_bytes"), [("Q4_K", "int4", 288), ("Q3_K", "int3", 112),
                                                         ("IQ4_XS", "int4", 272), ("Q2_K", "int2", 96),
                                                         ("IQ3_S", "int4", 288)])
def test_a_q4_k_m_file_runs_each_matrix_at_its_width_fused(tmp_path, base, width, code_bytes):
    """auto -> mixed: int4 where the file has Q4_K (int3 where Q3_K), int5 where it has 5 bits, int6 where it has
    Q6_K; a qkv whose v is wider than its q and k keeps v as its tail (int4 q, k and int6 or int5 v); the fused
    layers run the mix and track the file's float32 weights run dense (mean prompt logprob error about 0.007 here,
    against about 0.05 with every matrix int4)."""
    path = str(tmp_path / "mixed.gguf")
    write_mixed_file(path, base=base)
    files = GGUFModel(path)
    kind, why = resolve_quantization("auto", files, torch.device("cpu"))
    assert kind == "mixed" and f"{base}/Q5_K/Q6_K" in why
    mixed = Engine.from_model(load_model(files, torch.float32, progress=False, quant_blocks=True), None,
                              quantization=kind, max_total_tokens=1024)
    kinds = [[sorted(lin.quant.kinds) for lin in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                  layer.mlp.gate_up_proj, layer.mlp.down_proj)]
             for layer in mixed.model.layers]
    w = width
    assert kinds == [[sorted([w, "int6"]), [w], [w], ["int6"]], [sorted([w, "int5"]), [w], [w], ["int5"]]]
    qkv = mixed.model.layers[0].self_attn.qkv_proj.quant
    assert (qkv.kind, qkv.tail.kind, qkv.out_features, qkv.tail.out_features) == (w, "int6", 512, 128)
    assert qkv.data.shape[2] == code_bytes  # q, k in the K-quant, int3, IQ4_XS or int2 layout, exactly the file's
    assert mixed.runner.fused is not None and mixed.runner.fused.kinds == {w, "int5", "int6"}
    dense = Engine.from_model(load_model(files, torch.float32, progress=False), None, quantization="none",
                              max_total_tokens=1024)
    narrow = Engine.from_model(load_model(files, torch.float32, progress=False, quant_blocks=True), None,
                               quantization="int4", max_total_tokens=1024)  # the Q6_K matrices too
    eager = Engine.from_model(load_model(files, torch.float32, progress=False, quant_blocks=True), None,
                              quantization=kind, max_total_tokens=1024)
    eager.runner.fused = None  # the same matrices, layer by layer in Python
    got, want, four, layered = (prompt_logprobs(e) for e in (mixed, dense, narrow, eager))
    assert (got - layered).abs().max() < 0.02
    assert (got - want).abs().mean() < 0.03, (got - want).abs()
    assert (four - want).abs().mean() > 2 * (got - want).abs().mean()  # the 6-bit matrices' precision is kept


@pytest.mark.skipif(not cpu_ext.available(), reason="radixlm's CPU kernels did not build")
@pytest.mark.parametrize(("qtype", "kind"), [("Q6_K", "int6"), ("Q3_K", "int3"), ("Q2_K", "int2"), ("Q5_K", "int5"),
                                             ("Q5_0", "int5")])
def test_an_embedding_keeps_its_width_for_lookup_and_lm_head(tmp_path, qtype, kind):
    """Q4_K_M files keep the (tied) embedding in Q6_K, a Q2_K, Q3_K or 5-bit file may hold it in its own type: mixed
    keeps it so, the lookup reads its rows exactly and the LM head runs that width's kernel; the answers match the
    same file's float32 weights."""
    path = str(tmp_path / "sub_block_embedding.gguf")
    write_mixed_file(path, embedding=qtype)
    files = GGUFModel(path)
    mixed = Engine.from_model(load_model(files, torch.float32, progress=False, quant_blocks=True), None,
                              quantization="mixed", max_total_tokens=1024)
    table = mixed.model.embed_tokens
    assert table.quant.kind == kind and table.weight is None
    want_rows = QuantBlocks.from_gguf(files.header.data(files.header.tensors[0]), qtype, [320, 256]).dequantize()
    ids = torch.tensor([0, 17, 319, 160, 17])
    assert torch.equal(table(ids), want_rows[ids])
    dense = Engine.from_model(load_model(files, torch.float32, progress=False), None, quantization="none",
                              max_total_tokens=1024)
    got, want = prompt_logprobs(mixed), prompt_logprobs(dense)
    assert (got - want).abs().mean() < 0.03, (got - want).abs()


def prompt_logprobs(e: Engine) -> torch.Tensor:
    prompt = [(37 * j + 5) % 320 for j in range(60)]
    out = e.generate(input_ids=prompt, sampling_params={"temperature": 0, "max_new_tokens": 1}, return_logprob=True,
                     logprob_start_len=0)
    return torch.tensor([x[0] for x in out["meta_info"]["input_token_logprobs"][1:]])


@pytest.mark.skipif(not cpu_ext.available(), reason="radixlm's CPU kernels did not build")
def test_tensor_parallel_ranks_hold_their_slices_of_the_k_quant_blocks(tmp_path):
    """Under TP 2 each rank's stacked qkv (Q4_K q, k with a Q5_K v: int4 and an int5 tail, both in the K-quant
    layout) is its rows of the single rank's, bit for bit; the row-split down matrix (its groups would split) goes
    dense, then int4."""
    from radixlm.runtime.model.layers import TPInfo
    from radixlm.runtime.model.quantization import quantize_model

    path = str(tmp_path / "mixed.gguf")
    write_mixed_file(path)
    files, isa = GGUFModel(path), cpu_ext.resolve(cpu_ext.supported()[-1])

    def loaded(tp: TPInfo | None):
        model = load_model(files, torch.float32, tp, progress=False, quant_blocks=True)
        quantize_model(model, "mixed", keep_dense=False, isa=isa)
        return model.layers[1]

    full = loaded(None).self_attn.qkv_proj.quant
    assert (full.kind, full.tail.kind, full.data.shape[2], full.tail.data.shape[2]) == ("int4", "int5", 288, 352)
    whole = full.dequantize()
    for rank in range(2):
        layer = loaded(TPInfo(rank, 2))
        qkv = layer.self_attn.qkv_proj
        rows = torch.cat([torch.arange(start, start + size) + sum((256, 128, 128)[:i])
                          for i, (start, size) in enumerate(qkv.parts)])
        assert qkv.quant.tail.data.shape[2] == 352 and torch.equal(qkv.quant.dequantize(), whole[rows])
        assert layer.mlp.down_proj.quant.kind == "int4"
