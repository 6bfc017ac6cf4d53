"""A quantized model's CPU forward with its decoder layers as one C++ object (kernels/cpu_decoder_layer.cpp).

Eager decode with torch's ops runs ~25 ops a layer, each with Python and dispatch around it, which cost
more than the int4 matmuls themselves; a compiled graph removes that at the price of a compile at startup.
The fused layers remove it without one: a decode step is the embedding and one call for the layers, the
final norm and the LM head (the head in the call where it is on radixlm's quantized kernels, as the layers
are). Every kernel in it gives a row the same bits whatever the batch, so the model's output for a request
does not depend on the requests batched with it, nor on whether its prefix came from the cache.

It takes models whose linear layers all run on radixlm's matmul kernels (int2 - int6 and int8, each matrix its
own, a stacked qkv or gate_up with its last rows in another width as a tail; or the dense bfloat16 tiles) on one
rank, with the C++ attention (head dim 64 or 128); ModelRunner uses it for every batch then.
"""

from __future__ import annotations

import torch

from radixlm.kernels.sampling import RowSettings, StepDraws
from radixlm.runtime.batch import ForwardBatch
from radixlm.runtime.model.llama import LlamaForCausalLM
from radixlm.runtime.model.quantization import QuantWeight

PROJECTIONS = ("qkv", "o", "gate_up", "down")
STACKED = ("qkv", "gate_up")  # the projections FusedLayers takes with a tail (rows in another width)


def _linears(layer) -> dict:
    attn, mlp = layer.self_attn, layer.mlp
    return {"qkv": attn.qkv_proj, "o": attn.o_proj, "gate_up": mlp.gate_up_proj, "down": mlp.down_proj}


def fusable(model: LlamaForCausalLM) -> frozenset[str] | None:
    """The kinds of matrix of a model the fused layers can run ({"dense"}, or some of int2 - int8),
    else None."""
    if model.tp.size != 1 or not model.layers:
        return None
    kinds: set[str | None] = set()
    for layer in model.layers:
        for name, lin in _linears(layer).items():
            q = lin.quant
            native = q is not None and q.backend == "native" and lin.weight is None
            kinds |= q.kinds if native and (q.tail is None or name in STACKED) else {None}
    if None in kinds or not (kinds == {"dense"} or kinds <= {"int2", "int3", "int4", "int5", "int6", "int8"}):
        return None
    return frozenset(kinds)


# the phases of a layer in FusedLayers.phase_profile's order (kernels/cpu_phase_clock.h)
PHASES = ("norm", "qkv", "rope + kv store", "attention", "attention's prepare", "o", "norm 2", "gate_up", "silu",
          "down", "LM head")


def _head_weights(model: LlamaForCausalLM) -> list[torch.Tensor]:
    """The LM head's (data, scales, mins) for the fused call where it runs on radixlm's quantized kernels alone
    (no dense copy, no tail; one rank), else none: the model's own head then takes the final norm."""
    head = model.lm_head
    q = head.quant
    if q is None or q.backend != "native" or q.kind == "dense" or q.tail is not None or head.weight is not None:
        return []
    return [q.data, q.scales, q.mins if q.mins is not None else torch.empty(0)]


def _embed_tables(model: LlamaForCausalLM) -> list[torch.Tensor]:
    """The embedding table as the call's decode steps look rows up in it: the dense [V, H] weight, or an int8
    table's (q, d); else none (its rows are looked up from Python, step by step)."""
    embed = model.embed_tokens
    if embed.weight is not None:
        return [embed.weight]
    q = embed.quant
    if q is not None and q.kind == "int8" and q.backend == "native" and q.tail is None:
        return [q.data, q.scales]
    return []


class FusedLayers:
    def __init__(self, model: LlamaForCausalLM, k_buffer: list[torch.Tensor], v_buffer: list[torch.Tensor],
                 isa: int) -> None:
        self.model, self.isa = model, isa
        self.kinds = fusable(model)
        if self.kinds is None:
            raise ValueError("fused layers: the model's linear layers are not all on radixlm's kernels")
        weights = [w for layer in model.layers for w in self._layer_weights(layer)]  # 21 per layer
        head = _head_weights(model)
        self.head_fused = bool(head)
        self.embed = _embed_tables(model) if head else []  # run_steps needs both
        self.no_extend = torch.empty(0, dtype=torch.int64)  # a decode step's ext_lens
        self.no_draws = torch.empty(0, 0, dtype=torch.float64)  # run_steps' u where every row is greedy
        self.no_raw = torch.empty(0)  # run_steps' raw where no row wants logprobs
        self.no_raw_rows = torch.empty(0, dtype=torch.int64)
        self.layers = torch.classes.radixlm_cpu.FusedLayers(weights, model.norm.weight, k_buffer, v_buffer,
                                                            model.cfg.rms_norm_eps, model.layers[0].self_attn.num_heads,
                                                            model.rotary.cos, model.rotary.sin, head)

    def _layer_weights(self, layer) -> list[torch.Tensor]:
        """The layer's 21 weights for FusedLayers: norm1, qkv (3), qkv's tail (3), qkv bias, o (3), norm2, gate_up
        (3), gate_up's tail (3), down (3); a missing tail or minimums are empty tensors."""
        lin = _linears(layer)
        dtype = layer.input_layernorm.weight.dtype
        empty = torch.empty(0)

        def quant(q: QuantWeight | None) -> list[torch.Tensor]:
            if q is None:
                return [empty] * 3
            return [q.data, q.scales, q.mins if q.mins is not None else empty]

        qkv, gate_up = lin["qkv"].quant, lin["gate_up"].quant
        bias = lin["qkv"].bias if lin["qkv"].bias is not None else torch.empty(0, dtype=dtype)
        return [layer.input_layernorm.weight, *quant(qkv), *quant(qkv.tail), bias, *quant(lin["o"].quant),
                layer.post_attention_layernorm.weight, *quant(gate_up), *quant(gate_up.tail),
                *quant(lin["down"].quant)]

    @torch.inference_mode()
    def run(self, batch: ForwardBatch, table: torch.Tensor) -> torch.Tensor:
        """A batch, and the requests' slot table (ReqToTokenPool.table: the call reads each request's row of it)
        -> logits [len(batch.logit_rows), vocab] float32."""
        model = self.model
        x = model.embed_tokens(batch.input_ids)
        seq = torch.tensor(batch.seq_lens, dtype=torch.int64)
        ext = self.no_extend if batch.mode == "decode" else torch.tensor(batch.extend_lens, dtype=torch.int64)
        n = len(model.layers) if batch.num_layers is None else batch.num_layers
        out = self.layers.run(x, batch.positions, batch.out_cache_loc, table, batch.req_rows, seq, ext, n,
                              batch.logit_rows, self.isa)
        if self.head_fused:  # out: the logits of the logit rows
            return out[:, : model.lm_head.vocab_size]
        return model.lm_head.logits(out)  # out: the final norm of the logit rows

    @torch.inference_mode()
    def run_steps(self, batch: ForwardBatch, table: torch.Tensor, locs: torch.Tensor, draws: StepDraws | None,
                     raw_rows: list[int] | None = None) -> tuple[list[list[int]], torch.Tensor | None] | None:
        """A decode batch of each request's last token, locs [B, K] its next K slots and what the rows choose with
        (None: every row greedy, without bias or penalties) -> each request's K tokens, the forward passes and token
        choices of K single steps in one call, and where raw_rows names rows, their logits of each step as the
        model gave them, float32 [K, len(raw_rows), vocab] (for logprobs); None where the call cannot (no LM head or
        embedding table inside it)."""
        if not self.embed or batch.num_layers is not None:
            return None
        seq = torch.tensor(batch.seq_lens, dtype=torch.int64)
        rows = draws.rows if draws is not None else RowSettings([], [], [], [])
        u = draws.u if draws is not None else self.no_draws
        settings, tokens = ([], []) if draws is None or draws.penalties is None else draws.penalties.packed()
        vocab = self.model.lm_head.vocab_size
        keep = bool(raw_rows)
        raw = torch.empty(locs.shape[1], len(raw_rows), vocab) if keep else self.no_raw
        rows_kept = torch.tensor(raw_rows, dtype=torch.int64) if keep else self.no_raw_rows
        chosen = self.layers.decode_steps(batch.input_ids, batch.positions, locs, table, batch.req_rows, seq,
                                          self.embed, vocab, rows.temperature, rows.top_k, rows.top_p, rows.min_p, u,
                                          settings, tokens, raw, rows_kept, self.isa)
        return chosen.tolist(), raw if keep else None

    def profile_phases(self, on: bool) -> None:
        """Start (from zero) or stop summing where run()'s time goes, per thread and phase."""
        self.layers.set_profiling(on)

    def phase_profile(self) -> torch.Tensor:
        """float64 [threads, 2, len(PHASES)]: each phase's work, then the wait at the barrier after it, in
        microseconds summed over the calls since profile_phases(True); the LM head's (last) on thread 0 alone."""
        return self.layers.phase_profile()

