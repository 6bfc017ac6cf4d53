"""The separate draft model of --speculative-draft-model: loaded like the target, checked against it, and run
by a runner that shares the target's slots (see execute/draft_model.py)."""

from __future__ import annotations

import logging

import torch

from radixlm.runtime.config import EngineConfig
from radixlm.runtime.model.llama import LlamaForCausalLM
from radixlm.runtime.model.loader import load_for
from radixlm.runtime.model.runner import ModelRunner

log = logging.getLogger("radixlm.model")


def load_draft(cfg: EngineConfig, target_vocab: dict[str, int] | None, target: LlamaForCausalLM,
               progress: bool = True) -> LlamaForCausalLM:
    """The draft model of ``cfg`` (its weights in the target's form and dtype), ValueError naming
    speculative_draft_model where its vocabulary is not the target's."""
    path = cfg.speculative.speculative_draft_model
    try:
        files, model, _, _ = load_for(cfg.replace(model=path), progress=progress)
    except (OSError, ValueError) as e:
        raise ValueError(f"speculative_draft_model: {e}") from e
    check_vocabulary(model, target, vocabulary(files), target_vocab)
    log.info("speculative draft model: %s (%d layers)", path, model.cfg.num_layers)
    return model


def vocabulary(files) -> dict[str, int] | None:
    """A model's token -> id map (its cached Rust tokenizer where it has one; None without a tokenizer)."""
    light = files.light_tokenizer()
    tokenizer = light[0] if light is not None else files.load_tokenizer()
    return None if tokenizer is None else tokenizer.get_vocab()


def check_vocabulary(draft: LlamaForCausalLM, target: LlamaForCausalLM, draft_vocab: dict[str, int] | None,
                     target_vocab: dict[str, int] | None) -> None:
    if draft.cfg.vocab_size != target.cfg.vocab_size:
        raise ValueError(f"speculative_draft_model: its vocabulary has {draft.cfg.vocab_size} ids, the model's "
                         f"{target.cfg.vocab_size}: a draft must share the model's tokenizer")
    if draft_vocab is not None and target_vocab is not None and draft_vocab != target_vocab:
        differ = sorted(set(draft_vocab.items()) ^ set(target_vocab.items()))[:3]
        raise ValueError(f"speculative_draft_model: its tokenizer is not the model's (e.g. {differ}): a draft "
                         "must share the model's tokenizer")


def draft_runner(draft: LlamaForCausalLM, cfg: EngineConfig, dtype: torch.dtype, target: ModelRunner
                 ) -> tuple[ModelRunner, torch.Tensor]:
    """The draft's runner on the target's slots, and its per-slot flag (watched by the shared allocator)."""
    runner = ModelRunner(draft, cfg, dtype, slots_of=target)
    valid = torch.zeros(runner.pool.num_slots, dtype=torch.bool, device=runner.device)
    target.allocator.watch(valid)
    return runner, valid
