"""GGUF's IQ and ternary types as radixlm's kernel forms (runtime/model/gguf_blocks.py, gguf_iq.py), against the
`gguf` package's own dequantization: IQ4_NL / IQ4_XS as int4 codes into their values, IQ2 / IQ1_S into the grids'
values (IQ4_XS's layout, or the table form with scales per 16: IQ2_XS, IQ2_S, IQ1_M), IQ3_XXS as int6, IQ3_S in the K-quant
form and TQ1_0 / TQ2_0 as int2, exactly (IQ3_S but for a float16 rounding); and a file of IQ2 layers serves."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixlm.kernels import cpu_ext
from radixlm.kernels import cpu_matmul as ck
from radixlm.runtime.engine import Engine
from radixlm.runtime.model.gguf_blocks import QuantBlocks
from radixlm.runtime.model.gguf_file import GGUFModel
from radixlm.runtime.model.loader import load_model, resolve_quantization
from radixlm.runtime.model.quantization import QuantWeight

from .test_cpu_kernels import assert_close_to_reference
from .test_gguf_blocks import prompt_logprobs, random_blocks, reference, write_mixed_file


@pytest.mark.parametrize("qtype", ["IQ4_NL", "IQ4_XS"])
def test_iq4_loads_exactly_as_int4_codes_into_its_values(qtype):
    """IQ4_NL (w = d kv[q] per 32) and IQ4_XS (w = d sc kv[q], a 6-bit sc per 32, d per 256): the codes and scales as
    the file holds them (gguf's dequantization bit for bit), through the kernels' IQ4 layout, its embedding rows
    and its matmul; stacked with another 4-bit form they requantize (as int8 unless told), apart they keep it."""
    raw = random_blocks(qtype, 32, 512, seed=6)
    want = reference(raw, qtype, 32, 512)
    blocks = QuantBlocks.from_gguf(raw, qtype, [32, 512])
    assert blocks.bits == 4 and blocks.iq4 and blocks.form == qtype.lower()
    assert torch.equal(blocks.dequantize(), want)
    quant = QuantWeight.from_iq4_codes(blocks.q, blocks.d, blocks.sub, torch.float32, cpu_ext.resolve("portable")) \
        if cpu_ext.available() else None
    if quant is not None:
        assert quant.kind == "int4" and torch.equal(quant.dequantize(), want)
        ids = torch.tensor([0, 9, 31, 16])
        assert torch.equal(quant.rows(ids), want[ids])
        x = torch.randn(3, 512)
        assert_close_to_reference(quant.matmul(x), ck.int4_linear_torch(x, quant.data, quant.scales, None))
    four = QuantBlocks.from_gguf(random_blocks("Q4_K", 32, 512), "Q4_K", [32, 512])
    assert QuantBlocks.stack([blocks, blocks]).form == blocks.form
    assert QuantBlocks.stack([blocks, four]).bits == 8 and QuantBlocks.stack([blocks, four], bits=4).form == "int4"
    assert [b.form for b in QuantBlocks.stack_runs([four, blocks])] == ["int4", blocks.form]
    with pytest.raises(ValueError, match="IQ4 blocks have no minimums"):
        blocks.minimums()


def test_iq3_s_loads_as_int4_in_the_k_quant_form():
    """IQ3_S's weights are db g, g odd in [-15, 15], db = d (1 + 2 s) per 32: int4 codes (g + 15) / 2 with the K-quant
    form's sc = m = 1 + 2 s, d' = 2 d and dmin = 15 d, exact but for 15 d's float16 rounding (a few thousandths of
    a step here)."""
    raw = random_blocks("IQ3_S", 32, 512, seed=8, scale=0.05)
    want = reference(raw, "IQ3_S", 32, 512)
    blocks = QuantBlocks.from_gguf(raw, "IQ3_S", [32, 512])
    assert blocks.bits == 4 and blocks.kq is not None and int(blocks.q.max()) <= 15
    assert torch.equal(blocks.kq.sc, blocks.kq.m) and bool((blocks.kq.sc % 2 == 1).all())
    db = blocks.kq.d.float().repeat_interleave(8, 1) / 2 * blocks.kq.sc.float()  # d (1 + 2 s), exact
    g = 2 * blocks.q.float().view(32, 16, 32) - 15  # the grid points with their signs, decoded from the bytes
    assert torch.equal(g * db[..., None], want.view(32, 16, 32))
    step = want.view(32, 16, 32).abs().amax(dim=2, keepdim=True) / 15  # db: the largest |g| in a group is near 15
    err = (blocks.dequantize() - want).view(32, 16, 32).abs()
    assert float((err / step).max()) < 0.01
    assert float(want.abs().max()) > 0


@pytest.mark.parametrize("qtype", ["TQ1_0", "TQ2_0"])
def test_ternary_types_load_exactly_as_int2(qtype):
    """TQ1_0 / TQ2_0 hold w = d t with t in {-1, 0, 1} (random TQ2_0 bytes also give 2): Q2_K's form with q = t + 1,
    sc = m = 1 and dmin = d, exactly."""
    raw = random_blocks(qtype, 32, 512, seed=10, scale=0.05)
    want = reference(raw, qtype, 32, 512)
    blocks = QuantBlocks.from_gguf(raw, qtype, [32, 512])
    assert blocks.bits == 2 and blocks.kq is not None and int(blocks.q.max()) <= 3
    assert torch.equal(blocks.dequantize(), want) and float(want.abs().max()) > 0


def test_iq1_m_loads_exactly_in_the_table_form():
    """IQ1_M's weights are d (1 + 2 s) (g -+ 1 / 8), g in -1, 0, 1, s per 16, a delta a point of 8, d float16 in the
    scales' top nibbles: the table form holds them exactly, codes into GRID_VALUES' 8 g -+ 1, sub = 1 + 2 s and d / 8
    per 256, through the blocks and the kernels' layout."""
    raw = random_blocks("IQ1_M", 32, 512, seed=13)
    d = np.random.default_rng(13).uniform(5e-3, 5e-2, size=raw.size // 56).astype(np.float16).view(np.uint16)
    words = raw.reshape(-1, 56)[:, 48:].copy().view(np.uint16)  # d's nibbles on top of the scales' 12 bits
    words[:] = (words & 0x0FFF) | (((d[:, None] >> np.array([0, 4, 8, 12], dtype=np.uint16)) & 15) << 12)
    raw.reshape(-1, 56)[:, 48:] = words.view(np.uint8)
    want = reference(raw, "IQ1_M", 32, 512)
    blocks = QuantBlocks.from_gguf(raw, "IQ1_M", [32, 512])
    assert blocks.form == "grid16" and blocks.sub.shape == (32, 32) and bool((blocks.sub % 2 == 1).all())
    assert torch.equal(blocks.dequantize(), want) and float(want.abs().max()) > 0
    assert set(blocks.q.unique().tolist()) == set(range(6, 12))
    if cpu_ext.available():
        quant = QuantWeight.from_iq4_codes(blocks.q, blocks.d, blocks.sub, torch.float32, cpu_ext.resolve("auto"),
                                           blocks.values)
        assert quant.data.shape[2] == ck.TABLE_BYTES and torch.equal(quant.dequantize(), want)


def test_iq3_xxs_loads_exactly_as_int6():
    """IQ3_XXS's weights are d (1 + 2 s) / 4 g, g in +-(4, 12, .., 52, 62) per 32: even, so Q6_K's form holds them
    exactly with q - 32 = g / 2, sc = 1 + 2 s for both sub-blocks of 16 and d / 2 per 256."""
    raw = random_blocks("IQ3_XXS", 32, 512, seed=9, scale=0.05)
    want = reference(raw, "IQ3_XXS", 32, 512)
    blocks = QuantBlocks.from_gguf(raw, "IQ3_XXS", [32, 512])
    assert blocks.bits == 6 and blocks.sub.shape == (32, 32) and torch.equal(blocks.sub[:, 0::2], blocks.sub[:, 1::2])
    assert torch.equal(blocks.dequantize(), want) and float(want.abs().max()) > 0
    assert set((blocks.q.long() - 32).abs().unique().tolist()) <= {2, 6, 10, 14, 18, 22, 26, 31}


@pytest.mark.parametrize("qtype", ["IQ2_XXS", "IQ1_S", "IQ2_XS", "IQ2_S"])
def test_iq1_s_and_iq2_load_exactly_as_codes_into_the_grid_values(qtype):
    """IQ2_* (d (1 + 2 s) / 8 times +-8, +-25 or +-43) and IQ1_S (d (1 + 2 s) (g -+ 1 / 8), g in -1, 0, 1): codes into
    GRID_VALUES with sc = 1 + 2 s and d / 8, in IQ4_XS's layout (s per 32) or the table form (IQ2_XS, IQ2_S: s per
    16), gguf's dequantization bit for bit through the blocks, the kernels' layout, its embedding rows and its
    matmul; the types of one form stack as it."""
    raw = random_blocks(qtype, 32, 512, seed=11, scale=0.05)  # d / 8 within float16's normal range
    want = reference(raw, qtype, 32, 512)
    blocks = QuantBlocks.from_gguf(raw, qtype, [32, 512])
    per_16 = qtype in ("IQ2_XS", "IQ2_S")
    assert blocks.bits == 4 and blocks.grid and blocks.form == ("grid16" if per_16 else "grid")
    assert blocks.sub.shape == (32, 32 if per_16 else 16)
    assert set(blocks.q.unique().tolist()) == (set(range(6, 12)) if qtype == "IQ1_S" else set(range(6)))
    assert torch.equal(blocks.dequantize(), want) and float(want.abs().max()) > 0
    if cpu_ext.available():
        quant = QuantWeight.from_iq4_codes(blocks.q, blocks.d, blocks.sub, torch.float32, cpu_ext.resolve("auto"),
                                           blocks.values)
        assert quant.kind == "int4" and torch.equal(quant.dequantize(), want)
        ids = torch.tensor([0, 9, 31, 16])
        assert torch.equal(quant.rows(ids), want[ids])
        x = torch.randn(3, 512)
        assert_close_to_reference(quant.matmul(x), ck.int4_linear_torch(x, quant.data, quant.scales, quant.mins))
    kin = "IQ2_S" if per_16 else "IQ1_S"
    other = QuantBlocks.from_gguf(random_blocks(kin, 16, 512, seed=12, scale=0.05), kin, [16, 512])
    both = QuantBlocks.stack([blocks, other])
    assert both.grid and torch.equal(both.dequantize(), torch.cat([want, other.dequantize()]))


@pytest.mark.skipif(not cpu_ext.available(), reason="radixlm's CPU kernels did not build")
@pytest.mark.parametrize("base", ["IQ2_XXS", "IQ2_XS"])
def test_a_file_of_iq2_layers_serves(tmp_path, base):
    """A file whose layers are IQ2_XXS (IQ4_XS's layout) or IQ2_XS (the table form: codes into the grid's values
    with scales per 16) runs those layers so, the others at their own width (a qkv's v apart, as a tail), and the
    answers track the file's float32 weights."""
    path = str(tmp_path / "iq2.gguf")
    write_mixed_file(path, base=base)
    files = GGUFModel(path)
    kind, why = resolve_quantization("auto", files, torch.device("cpu"))
    assert kind == "mixed" and base in why
    mixed = Engine.from_model(load_model(files, torch.float32, progress=False, quant_blocks=True), None,
                              quantization=kind, max_total_tokens=1024)
    qkv = mixed.model.layers[1].self_attn.qkv_proj.quant
    assert sorted(qkv.kinds) == ["int4", "int5"] and qkv.data.shape[2] == (256 + 16 if base == "IQ2_XXS" else 144)
    dense = Engine.from_model(load_model(files, torch.float32, progress=False), None, quantization="none",
                              max_total_tokens=1024)
    got, want = prompt_logprobs(mixed), prompt_logprobs(dense)
    assert (got - want).abs().mean() < 0.03, (got - want).abs()
