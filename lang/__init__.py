"""radixlm.lang: SGLang-style programs (`@function`, `gen`, `select`, roles, fork/join) over our runtime,
an in-process Engine, or any OpenAI-compatible server. Importing it does not import torch."""

from radixlm.lang.api import (
    assistant,
    assistant_begin,
    assistant_end,
    flush_cache,
    function,
    gen,
    gen_int,
    gen_string,
    select,
    set_default_backend,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
)
from radixlm.lang.engine_backend import EngineBackend
from radixlm.lang.openai_backend import OpenAI
from radixlm.lang.runtime_backend import Runtime, RuntimeEndpoint
from radixlm.lang.state import ProgramState

__all__ = ["EngineBackend", "OpenAI", "ProgramState", "Runtime", "RuntimeEndpoint", "assistant", "assistant_begin",
           "assistant_end", "flush_cache", "function", "gen", "gen_int", "gen_string", "select",
           "set_default_backend", "system", "system_begin", "system_end", "user", "user_begin", "user_end"]
