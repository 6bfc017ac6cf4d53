"""Program state: ``s += expr`` queues work on the state's executor thread; reading a variable waits.

Invariant: one executor thread per state runs its expressions in order, so the text always grows in
program order; variables become readable (their Event is set) only once fully generated.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from radixlm.lang.backend import Backend
from radixlm.lang.chat_template import PLAIN, RoleTemplate
from radixlm.lang.choices import ChoiceScores, decide
from radixlm.lang.ir import Expr, Gen, RoleBegin, RoleEnd, Select, Text, as_expr, flatten

_STOP = object()


class StreamExecutor:
    def __init__(self, backend: Backend, defaults: dict[str, Any], stream: bool = False,
                 text: str = "", variables: dict | None = None, messages: list | None = None) -> None:
        self.backend, self.defaults, self.stream = backend, defaults, stream
        self.text, self.variables = text, dict(variables or {})
        self.meta: dict[str, Any] = {}
        self.messages = list(messages or [])
        self.events: dict[str, threading.Event] = {}
        self.error: Exception | None = None
        self.role: tuple[str, int] | None = None  # current role and where its content starts
        self.chunks: queue.Queue = queue.Queue()  # streamed (var name, text delta); None ends
        self._q: queue.Queue = queue.Queue()
        self._pending = 0  # expressions submitted and not yet run (guarded by _lock)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ API for the state
    def submit(self, expr: Expr) -> None:
        for e in flatten(expr):
            if isinstance(e, (Gen, Select)) and e.name:
                self.events.setdefault(e.name, threading.Event()).clear()
            with self._lock:
                self._pending += 1
            self._q.put(e)

    def end(self) -> None:
        self._q.put(_STOP)

    def wait(self, done: Callable[[], bool]) -> None:
        self.backend.wait_until(done)

    def idle(self) -> bool:
        with self._lock:
            return self._pending == 0

    def sync(self) -> None:
        self.wait(self.idle)

    def get(self, name: str) -> Any:
        if name not in self.events and name not in self.variables:
            raise KeyError(f"no variable {name!r} in this program state")
        if name in self.events:
            ev = self.events[name]
            self.wait(lambda: ev.is_set() or self.error is not None)
        if self.error is not None and name not in self.variables:
            raise RuntimeError(f"the program failed before {name!r} was set: {self.error}") from self.error
        return self.variables[name]

    # ------------------------------------------------------------ the worker
    def _loop(self) -> None:
        while True:
            e = self._q.get()
            if e is _STOP:
                self.chunks.put(None)
                return
            try:
                if self.error is None:
                    self._run(e)
            except Exception as exc:  # recorded; surfaces through s.error() and variable reads
                self.error = exc
                for ev in self.events.values():
                    ev.set()
            finally:
                with self._lock:
                    self._pending -= 1

    def _run(self, e: Expr) -> None:
        if isinstance(e, Text):
            self._append(e.text)
        elif isinstance(e, RoleBegin):
            self._append(self.template().begin(e.role, first=not self.text))
            self.role = (e.role, len(self.text))
        elif isinstance(e, RoleEnd):
            role, start = self.role or (e.role, len(self.text))
            self.messages.append({"role": role, "content": self.text[start:]})
            self._append(self.template().end(e.role))
            self.role = None
        elif isinstance(e, Gen):
            self._gen(e)
        elif isinstance(e, Select):
            self._select(e)

    def template(self) -> RoleTemplate:
        return self.backend.role_template() or PLAIN

    def _append(self, text: str, var: str | None = None) -> None:
        self.text += text
        if self.stream and text:
            self.chunks.put((var, text))

    def _gen(self, g: Gen) -> None:
        params = {**self.defaults, **g.params}
        choices = params.pop("choices", None)
        if choices:
            return self._select(Select(g.name, tuple(choices), params.get("temperature", 0.0)))
        logprob = {k: params.pop(k) for k in ("return_logprob", "logprob_start_len", "top_logprobs_num")
                   if k in params}
        if self.stream and not logprob:
            out, meta = "", None
            for delta, final in self.backend.generate_stream(self.text, params):
                out += delta
                self._append(delta, g.name)
                meta = final or meta
        else:
            res = self.backend.generate(self.text, params, logprob or None)
            out, meta = res["text"], res["meta_info"]
            self._append(out, g.name)
        self._set(g.name, out, meta)

    def _select(self, s: Select) -> None:
        unconditional = s.choices_method == "unconditional_likelihood_normalized"
        cond, uncond = self.backend.select(self.text, list(s.choices), unconditional)
        index, scores = decide(list(s.choices), ChoiceScores(cond, uncond), s.choices_method)
        self._append(s.choices[index], s.name)
        self._set(s.name, s.choices[index], {"scores": scores, "token_logprobs": cond})

    def _set(self, name: str | None, value: Any, meta: Any) -> None:
        if name:
            self.variables[name] = value
            self.meta[name] = meta
            self.events.setdefault(name, threading.Event()).set()


class RoleMethods:
    """Roles in context-manager form (``with s.user(): s += "..."``) for anything supporting ``+=``."""

    def system(self, expr: Any = None) -> _RoleScope:
        return _RoleScope(self, "system", expr)

    def user(self, expr: Any = None) -> _RoleScope:
        return _RoleScope(self, "user", expr)

    def assistant(self, expr: Any = None) -> _RoleScope:
        return _RoleScope(self, "assistant", expr)


class ProgramState(RoleMethods):
    """What a program function receives as ``s`` (and what ``run`` returns)."""

    def __init__(self, executor: StreamExecutor) -> None:
        self._ex = executor

    def __iadd__(self, other: Any) -> ProgramState:
        if other is None:
            raise TypeError("cannot append None to a program state")
        self._ex.submit(as_expr(other))
        return self

    def __getitem__(self, name: str) -> Any:
        return self._ex.get(name)

    def get_var(self, name: str) -> Any:
        return self._ex.get(name)

    def set_var(self, name: str, value: Any) -> None:
        self._ex.variables[name] = value

    def get_meta_info(self, name: str) -> Any:
        self._ex.get(name)
        return self._ex.meta.get(name)

    def text(self) -> str:
        self._ex.sync()
        return self._ex.text

    def messages(self) -> list[dict[str, str]]:
        self._ex.sync()
        return list(self._ex.messages)

    def error(self) -> Exception | None:
        self._ex.sync()
        return self._ex.error

    def sync(self) -> None:
        self._ex.sync()

    def var_scope(self, name: str) -> _VarScope:
        return _VarScope(self, name)

    # forking
    def fork(self, size: int = 1) -> ProgramStateGroup:
        self._ex.sync()
        if size > 1:  # commit the shared prefix once, so every branch hits it in the radix cache
            self._ex.backend.cache_prefix(self._ex.text)
        return ProgramStateGroup([self.copy() for _ in range(size)], self)

    def copy(self) -> ProgramState:
        self._ex.sync()
        ex = self._ex
        return ProgramState(StreamExecutor(ex.backend, ex.defaults, ex.stream, ex.text, ex.variables, ex.messages))

    # streaming
    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Text as it is generated (all of it, or one variable's), ending when the program ends."""
        while True:
            item = self._next_chunk()
            if item is None:
                return
            name, delta = item
            if var_name is None or name == var_name:
                yield delta

    async def text_async_iter(self, var_name: str | None = None) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        while True:
            item = await loop.run_in_executor(None, self._next_chunk)
            if item is None:
                return
            name, delta = item
            if var_name is None or name == var_name:
                yield delta

    def _next_chunk(self):
        box: list = []

        def ready() -> bool:
            if not box:
                try:
                    box.append(self._ex.chunks.get_nowait())
                except queue.Empty:
                    return False
            return True

        self._ex.wait(ready)
        return box[0]

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"


class _RoleScope:
    def __init__(self, s: ProgramState, role: str, expr: Any) -> None:
        self.s, self.role = s, role
        if expr is not None:
            s += RoleBegin(role) + as_expr(expr) + RoleEnd(role)

    def __enter__(self) -> ProgramState:
        self.s += RoleBegin(self.role)
        return self.s

    def __exit__(self, *exc) -> None:
        self.s += RoleEnd(self.role)


class _VarScope:
    def __init__(self, s: ProgramState, name: str) -> None:
        self.s, self.name = s, name

    def __enter__(self) -> ProgramState:
        self.s.sync()
        self.start = len(self.s._ex.text)
        return self.s

    def __exit__(self, *exc) -> None:
        self.s.sync()
        self.s.set_var(self.name, self.s._ex.text[self.start:])


class ProgramStateGroup:
    def __init__(self, states: list[ProgramState], parent: ProgramState) -> None:
        self.states, self.parent = states, parent

    def __len__(self) -> int:
        return len(self.states)

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __iter__(self):
        return iter(self.states)

    def __iadd__(self, other: Any) -> ProgramStateGroup:
        for i, s in enumerate(self.states):
            s += other(i) if callable(other) else (other[i] if isinstance(other, (list, tuple)) else other)
        return self

    def join(self) -> None:
        """Wait for every branch and gather their variables into lists on the parent state."""
        names: list[str] = []
        for s in self.states:
            s.sync()
            names += [n for n in s._ex.variables if n not in names]
        for n in names:
            if n in self.parent._ex.variables and all(n in s._ex.variables and
                                                       s._ex.variables[n] is self.parent._ex.variables[n]
                                                       for s in self.states):
                continue  # inherited, not produced by the branches
            self.parent.set_var(n, [s._ex.variables.get(n) for s in self.states])
