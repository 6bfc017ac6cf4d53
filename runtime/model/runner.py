"""Owns the model, the KV pool and the attention backend; turns a ForwardBatch into logits."""

from __future__ import annotations

import logging

import torch

from radixlm.kernels import cpu_ext
from radixlm.kernels.sampling import StepDraws
from radixlm.runtime.batch import ForwardBatch
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.kv.pool import KVPool, PageAllocator, ReqToTokenPool
from radixlm.runtime.model.attention import make_backend, resolve_backend
from radixlm.runtime.model.attention.cpu_decode import native_fits
from radixlm.runtime.model.fused import FusedLayers, fusable
from radixlm.runtime.model.invariance import invariance_gaps
from radixlm.runtime.model.layers import HeadShard
from radixlm.runtime.model.llama import LlamaForCausalLM
from radixlm.runtime.model.loader import prepare_weights
from radixlm.runtime.model.weight_arena import WeightArena

log = logging.getLogger("radixlm.model")


class ModelRunner:
    """``plan_sink`` (set by the engine on rank 0 of a TP group) broadcasts each batch to the other ranks.

    ``cpu_isa``: the path of radixlm's C++ CPU kernels this runner uses (kernels/cpu_ext.PATHS index; None:
    torch's ops). They run the quantized matmuls, the decode / extend attention where it fits, RMSNorm and
    silu * up on the eager path (prefill), and the grammar bitmask (sampler.apply_grammars)."""

    def __init__(self, model: LlamaForCausalLM, config: EngineConfig, dtype: torch.dtype,
                 slots_of: ModelRunner | None = None) -> None:
        """``slots_of``: a runner whose slots this one shares (a draft model's): its allocator and request table,
        and a pool of as many slots, so that slot s holds token s's KV in both pools."""
        self.model, self.plan_sink = model, None
        self.device = next(model.parameters()).device
        self.cpu_isa = cpu_ext.resolve(config.execution.cpu_kernels) if self.device.type == "cpu" else None
        if self.device.type == "cpu":
            log.info("CPU kernels: %s", cpu_ext.describe(self.cpu_isa))
        prepare_weights(model, config, self.cpu_isa)
        if self.weight_arena is not None:
            log.info("weights: %d tensors, %.1f MB in one block (transparent huge pages: %s)", self.weight_arena.tensors,
                     self.weight_arena.nbytes / 1e6, self.weight_arena.huge_pages)
        cfg = model.cfg
        self.max_context = min(config.load.context_length or cfg.max_position_embeddings, cfg.max_position_embeddings)
        self._build_pool(config, dtype, slots_of)
        num_q_heads = model.layers[0].self_attn.num_heads if cfg.num_layers else cfg.num_heads
        windows = [cfg.window(i) for i in range(cfg.num_layers)]
        windowed = any(w is not None for w in windows)  # (Gemma 3) torch's attention; no fused layers
        fits = self.backend_name == "torch" and native_fits(self.pool, num_q_heads, cfg.head_dim) and not windowed
        attention_isa = self.cpu_isa if fits else None
        if windowed and config.execution.enable_torch_compile:
            raise ValueError("enable_torch_compile: the compiled decode step has no sliding-window attention")
        self.backend = make_backend(self.backend_name, self.pool, self.req_to_token, config.cache.page_size,
                                    num_q_heads, attention_isa, config.execution.deterministic, windows)
        for module in model.modules():
            if hasattr(module, "cpu_isa"):
                module.cpu_isa = self.cpu_isa
        self.graphs = self.compiled = self.fused = None
        fused_kinds = fusable(model) if attention_isa is not None else None
        if self.device.type == "cpu" and config.execution.enable_torch_compile:
            from radixlm.runtime.model.cpu_graph import CompiledDecode

            self.compiled = CompiledDecode(model, self.pool, min(config.execution.torch_compile_max_bs,
                                                                 config.scheduler.max_running_requests), attention_isa)
        elif fused_kinds is not None:  # every batch through radixlm's fused decoder layers: no graph to compile
            self.fused = FusedLayers(model, self.pool.k_buffer, self.pool.v_buffer, attention_isa)
        self.invariance_gaps = invariance_gaps(model, self.device.type, self.cpu_isa, attention_isa,
                                               self.compiled is not None)
        if config.execution.deterministic and self.invariance_gaps:
            log.warning("not batch- / cache-invariant here: %s", "; ".join(self.invariance_gaps))
        if self.device.type == "cuda" and self.backend_name == "triton" and not config.execution.disable_cuda_graph:
            from radixlm.runtime.model.cuda_graph import DecodeGraphs

            self.graphs = DecodeGraphs(model, self.backend, self.req_to_token.dummy_row,
                                       min(config.execution.cuda_graph_max_bs, config.scheduler.max_running_requests))

    def _build_pool(self, config: EngineConfig, dtype: torch.dtype, slots_of: ModelRunner | None) -> None:
        """The KV pool (sized from the memory budget, the same on every TP rank), its allocator and the
        request -> slot table (``slots_of``'s allocator and table, and a pool of its size)."""
        cfg, page = self.model.cfg, config.cache.page_size
        kv_heads = self.model.layers[0].self_attn.num_kv_heads if cfg.num_layers else cfg.num_kv_heads
        self.backend_name = resolve_backend(config.execution.attention_backend, self.device)
        if slots_of is not None:
            self.kv_sized_by, self.allocator, self.req_to_token = "shared", slots_of.allocator, slots_of.req_to_token
            num_pages = self.allocator.num_pages
        else:
            tokens, self.kv_sized_by = self.pool_tokens(config, dtype)
            num_pages = tokens // page + 1  # + the reserved page 0
            self.allocator = PageAllocator(num_pages, page)
            self.req_to_token = ReqToTokenPool(config.scheduler.max_running_requests + 2, self.max_context + page,
                                               self.device)
        self.pool = KVPool(cfg, num_pages * page, dtype, kv_heads, self.device,
                           head_major=self.backend_name != "flashinfer")

    @property
    def weight_arena(self) -> WeightArena | None:
        """The block the kernels read the model's weights from (loader.prepare_weights placed them)."""
        return self.model.weight_arena

    def pool_tokens(self, config: EngineConfig, dtype: torch.dtype) -> tuple[int, str]:
        """The KV pool's size in tokens and what set it: --max-total-tokens; else --context-length, as llama.cpp's
        -c sizes its KV (one whole context, which shorter concurrent requests share); else the memory budget,
        --kv-cache-memory-gb over the model's bytes per token (on the TP rank with the most KV heads)."""
        if config.cache.max_total_tokens is not None:
            return config.cache.max_total_tokens, "max_total_tokens"
        if config.load.context_length is not None:
            return self.max_context, "context_length"
        cfg = self.model.cfg
        widest = HeadShard.max_kv_heads(cfg.num_heads, cfg.num_kv_heads, self.model.tp.size)
        per_token = KVPool.bytes_per_token(cfg, dtype, widest)
        return int(config.cache.kv_cache_memory_gb * 2**30 // per_token), "kv_cache_memory_gb"

    def release(self) -> None:
        """Free the KV pool and the kernels' state now, for an engine that is shut down: the engine, its core
        and scheduler hold one another, so without this their memory waits for the cycle collector."""
        self.fused = self.compiled = self.graphs = None
        self.pool.release()

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """-> logits [len(batch.logit_rows), vocab] float32."""
        if self.plan_sink is not None:
            self.plan_sink.send(batch)
        if self.device.type != "cpu":
            batch = batch.to(self.device)
            if self.graphs is not None and self.graphs.can_run(batch):
                return self.graphs.run(batch)
        batch.attn_backend = self.backend
        if self.fused is not None:  # the call reads the requests' slots from the table itself
            return self.fused.run(batch, self.req_to_token.table)
        self.backend.prepare(batch)
        if self.compiled is not None and self.compiled.can_run(batch):
            return self.compiled.run(batch)
        return self.model(batch)

    def fused_steps(self, batch: ForwardBatch, locs: list[torch.Tensor], draws: StepDraws | None,
                     raw_rows: list[int] | None = None) -> tuple[list[list[int]], torch.Tensor | None] | None:
        """A decode batch, each request's next K slots and the sampled rows' draws -> each request's K tokens from
        one call of the fused layers (and each step's logits of raw_rows, [K, len(raw_rows), vocab]); None where
        they cannot (the caller then runs the steps one forward at a time)."""
        if self.fused is None or self.plan_sink is not None:
            return None
        return self.fused.run_steps(batch, self.req_to_token.table, torch.stack(locs), draws, raw_rows)
