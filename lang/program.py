"""``@function`` programs: run, run_batch (with the constant prefix cached first), bind."""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from radixlm.lang.backend import Backend
from radixlm.lang.ir import Gen, RoleBegin, RoleEnd, Select, Text, as_expr, flatten
from radixlm.lang.state import ProgramState, RoleMethods, StreamExecutor


class Defaults:
    """Per-process default backend (set_default_backend); an object, not a module global."""

    backend: Backend | None = None


def resolve_backend(backend: Backend | None) -> Backend:
    backend = backend or Defaults.backend
    if backend is None:
        raise ValueError("no backend: pass backend=... or call set_default_backend(...)")
    return backend


class SglFunction:
    def __init__(self, func: Callable, bound: dict[str, Any] | None = None) -> None:
        self.func, self.bound = func, dict(bound or {})
        params = list(inspect.signature(func).parameters)
        if not params:
            raise ValueError(f"@function {func.__name__}: the first parameter must be the state `s`")
        self.arg_names = params[1:]

    def bind(self, **kwargs: Any) -> SglFunction:
        return SglFunction(self.func, {**self.bound, **kwargs})

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramState:
        return self.run(*args, **kwargs)

    def _split(self, kwargs: dict[str, Any]) -> tuple[dict, dict]:
        program = {k: v for k, v in kwargs.items() if k in self.arg_names}
        sampling = {k: v for k, v in kwargs.items() if k not in self.arg_names}
        return program, sampling

    def run(self, *args: Any, stream: bool = False, backend: Backend | None = None, **kwargs: Any) -> ProgramState:
        """Run the program; generation continues in the background until a variable or the text is read."""
        program_kwargs, sampling = self._split(kwargs)
        backend = resolve_backend(backend)
        state = ProgramState(StreamExecutor(backend, sampling, stream=stream))

        def body() -> None:
            try:
                self.func(state, *args, **{**self.bound, **program_kwargs})
            except Exception as e:  # a Python error in the body is the program's error too
                state._ex.error = state._ex.error or e
            finally:
                state._ex.end()

        if stream:
            threading.Thread(target=body, daemon=True).start()
        else:
            body()
        return state

    def run_batch(self, batch_kwargs: list[dict[str, Any]], *, backend: Backend | None = None,
                  num_threads: int | str = "auto", progress_bar: bool = False, generator_style: bool = False,
                  **sampling: Any) -> list[ProgramState] | Iterator[ProgramState]:
        backend = resolve_backend(backend)
        if len(batch_kwargs) > 1:
            prefix = self.constant_prefix(backend)
            if prefix:
                backend.cache_prefix(prefix)
        workers = min(len(batch_kwargs), max(64, (os.cpu_count() or 1) * 16)) if num_threads == "auto" else num_threads
        pool = ThreadPoolExecutor(max_workers=max(int(workers), 1))

        def one(kw: dict[str, Any]) -> ProgramState:
            if not isinstance(kw, dict):
                raise ValueError("run_batch: each item must be a dict of program arguments")
            state = self.run(backend=backend, **sampling, **kw)
            state.sync()
            return state

        futures = [pool.submit(one, kw) for kw in batch_kwargs]
        bar = _progress(len(futures)) if progress_bar else None

        def results() -> Iterator[ProgramState]:
            for f in futures:
                backend.wait_until(f.done)
                if bar:
                    bar.update(1)
                yield f.result()
            if bar:
                bar.close()
            pool.shutdown(wait=False)

        return results() if generator_style else list(results())

    def constant_prefix(self, backend: Backend) -> str:
        """Trace the program with placeholder arguments up to its first argument-dependent part."""
        tracer = _Tracer(backend)
        marks = {n: _Placeholder(f"\x00arg:{n}\x00") for n in self.arg_names if n not in self.bound}
        try:
            self.func(tracer, **{**self.bound, **marks})
        except _StopTrace:
            pass
        except Exception:  # any other failure while tracing: cache what was traced so far
            pass
        return tracer.text


class _Placeholder(str):
    pass


class _StopTrace(Exception):
    pass


class _Tracer(RoleMethods):
    """A state stand-in that records constant text and stops at the first dynamic part."""

    def __init__(self, backend: Backend) -> None:
        self.backend, self.text, self.first = backend, "", True

    def __iadd__(self, other: Any) -> _Tracer:
        for e in flatten(as_expr(other)):
            if isinstance(e, (Gen, Select)):
                raise _StopTrace
            if isinstance(e, Text):
                if "\x00arg:" in e.text:
                    self.text += e.text.split("\x00arg:", 1)[0]
                    raise _StopTrace
                self.text += e.text
            elif isinstance(e, (RoleBegin, RoleEnd)):
                template = self.backend.role_template()
                if template is None:
                    raise _StopTrace
                self.text += template.begin(e.role, not self.text) if isinstance(e, RoleBegin) else template.end(e.role)
        return self

    def __getitem__(self, name: str) -> Any:
        raise _StopTrace

    def __getattr__(self, name: str) -> Any:
        raise _StopTrace


def _progress(total: int):
    """A tqdm bar on a terminal, log lines elsewhere (lazy: lang never imports the runtime up front)."""
    from radixlm.runtime.progress import Progress

    return Progress("run_batch", total=total, unit="program")
