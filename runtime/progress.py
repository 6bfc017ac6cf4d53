"""Progress of long steps (weights, compilation, graph capture): a tqdm bar on a terminal, log lines elsewhere."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")
log = logging.getLogger("radixlm")


class Progress:
    """``with Progress("Compiling", total=3) as p: ... p.update()``. With ``enabled`` False nothing shows;
    when stderr is not a terminal, one log line says it started and one how long it took."""

    def __init__(self, desc: str, total: int | None = None, unit: str = "it", enabled: bool = True) -> None:
        self.desc, self.enabled = desc, enabled
        self.tty = enabled and sys.stderr.isatty()
        self.bar = tqdm(total=total, desc=desc, unit=unit, disable=not self.tty)
        self.start = time.monotonic()
        if enabled and not self.tty:
            log.info("%s ...", desc)

    def update(self, n: int = 1) -> None:
        self.bar.update(n)

    def wrap(self, items: Iterable[T]) -> Iterator[T]:
        for item in items:
            yield item
            self.update()

    def close(self) -> None:
        self.bar.close()
        if self.enabled and not self.tty:
            log.info("%s: done in %.1f s", self.desc, time.monotonic() - self.start)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
