"""ZeroMQ sockets over ipc:// in a private (0700) temporary folder, one name per channel."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import zmq


@dataclass(frozen=True)
class IpcPaths:
    folder: str

    @classmethod
    def create(cls) -> IpcPaths:
        folder = tempfile.mkdtemp(prefix="radixlm-")  # mkdtemp makes it 0700: only this user can connect
        os.chmod(folder, 0o700)
        return cls(folder)

    def addr(self, channel: str) -> str:
        return f"ipc://{os.path.join(self.folder, channel)}"

    @property
    def to_scheduler(self) -> str:
        return self.addr("scheduler")

    @property
    def to_api(self) -> str:
        return self.addr("api")

    @property
    def ready(self) -> str:
        return self.addr("ready")


def pull(ctx: zmq.Context, addr: str) -> zmq.Socket:
    s = ctx.socket(zmq.PULL)
    s.bind(addr)
    return s


def push(ctx: zmq.Context, addr: str) -> zmq.Socket:
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(addr)
    return s
