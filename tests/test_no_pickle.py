"""No socket or collective of ours carries pickle: IPC is typed msgpack (runtime/messages.py) and the TP batch
plan is msgpack bytes in a uint8 tensor (runtime/model/distributed.py)."""

from __future__ import annotations

import ast
import pathlib

import torch

from radixlm.runtime.batch import ForwardBatch
from radixlm.runtime.model.distributed import BatchPlan, _decode, _encode

ROOT = pathlib.Path(__file__).resolve().parent.parent
PICKLERS = ("pickle", "cPickle", "dill", "cloudpickle")
OBJECT_CALLS = {"broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list",
                "send_object_list", "recv_object_list", "send_pyobj", "recv_pyobj", "send_serialized",
                "recv_serialized"}  # torch.distributed's and pyzmq's pickling calls


def test_no_pickling_call_or_import_in_our_code():
    found = []
    for folder in ("runtime", "lang", "radix_cache", "constrained", "kernels"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = [a.name for a in node.names] + ([node.module] if getattr(node, "module", None) else [])
                    found += [f"{path}: import {n}" for n in names if n.split(".")[0] in PICKLERS]
                elif isinstance(node, ast.Attribute):
                    base = node.value.id if isinstance(node.value, ast.Name) else ""
                    if node.attr in OBJECT_CALLS or base in PICKLERS:
                        found.append(f"{path}:{node.lineno}: {base}.{node.attr}")
    assert not found, found


def test_the_batch_plan_round_trips_as_msgpack():
    table = torch.arange(40, dtype=torch.int32).view(4, 10)
    batch = ForwardBatch("extend", torch.tensor([5, 6, 7]), torch.tensor([0, 1, 2]), torch.tensor([11, 12, 13]),
                         torch.tensor([2]), [3], [3], torch.tensor([2]), None)
    raw = _encode(BatchPlan.of(batch, table))
    assert isinstance(raw, bytes) and b"\x80\x04" not in raw[:2]  # msgpack, not a pickle protocol header
    other = torch.zeros_like(table)
    out = _decode(raw).apply(other)
    assert torch.equal(other[2, :3], table[2, :3]) and out.input_ids.tolist() == [5, 6, 7]
    assert out.req_rows.tolist() == [2] and out.seq_lens == [3] and out.mode == "extend"
