"""Where the forward pass runs and how it is split: device, kernels, threads, parallel ranks."""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.runtime.config.options import (
    ATTENTION_BACKENDS,
    CPU_KERNELS,
    check_choices,
    check_positive,
    opt,
)


@dataclass(frozen=True)
class ExecutionConfig:
    """Where and how the forward pass runs: device, attention backend, kernels, graphs, threads."""

    device: str = opt("auto", "where the model runs: cuda if available, else cpu", choices=("auto", "cpu", "cuda"))
    attention_backend: str = opt("auto", "auto: flashinfer if importable on CUDA, else triton on CUDA, else torch",
                                  choices=ATTENTION_BACKENDS)
    disable_cuda_graph: bool = opt(False, "run decode batches eagerly instead of replaying captured CUDA graphs")
    cuda_graph_max_bs: int = opt(256, "largest decode batch captured in a CUDA graph (larger ones run eagerly)")
    cpu_kernels: str = opt("auto", "radixlm's C++ CPU kernels (int4/int8 matmuls, attention, norms, the grammar "
                            "bitmask; built on first use, then cached): auto runs the fastest path this CPU has "
                            "(avx512_bf16, avx512, avx2_vnni, avx2 or portable; neon on ARM), a path's name "
                            "forces it, torch: torch's ops only", choices=CPU_KERNELS)
    enable_torch_compile: bool = opt(False, "CPU: run decode batches through one torch.compile'd graph "
                                      "(compiled at startup, cached on disk)")
    torch_compile_max_bs: int = opt(16, "largest decode batch the compiled CPU step runs (larger ones run eagerly)")
    num_threads: int | None = opt(None, "torch intra-op threads; default: OMP_NUM_THREADS if set, else the CPUs "
                                   "this process may run on (its affinity mask), shared among the TP ranks")
    deterministic: bool = opt(True, "batch- and cache-invariant decoding: a request's tokens and logprobs do not "
                               "depend on what it is batched with, the radix cache, chunking, page size or "
                               "speculation (radixlm's kernels for every matmul, norm and attention). "
                               "--no-deterministic allows --cpu-kernels torch and --enable-torch-compile, which "
                               "are not invariant")

    def __post_init__(self) -> None:
        check_positive(self, "torch_compile_max_bs")
        check_choices(self)
        if self.deterministic and self.cpu_kernels == "torch":
            raise ValueError("cpu_kernels 'torch': torch's matmuls and attention are not batch-invariant; add "
                             "--no-deterministic (deterministic=False) to use them")
        if self.deterministic and self.enable_torch_compile:
            raise ValueError("enable_torch_compile: the compiled decode step is not batch-invariant (its kernels "
                             "are not the eager extend's); add --no-deterministic (deterministic=False) to use it")


@dataclass(frozen=True)
class ParallelConfig:
    """Tensor-parallel ranks, where they meet, and data-parallel replicas."""

    tp_size: int = opt(1, "tensor-parallel ranks (one scheduler process each; gloo on the CPU, NCCL on GPUs)")
    dp_size: int = opt(1, "data-parallel replicas, each with its own radix cache, behind a cache-aware router")
    dist_init_addr: str | None = opt(None, "host:port where TP ranks meet; default: a free port on 127.0.0.1")
    nnodes: int = opt(1, "machines the TP group spans")
    node_rank: int = opt(0, "this machine's index among --nnodes (0 serves HTTP)")

    def __post_init__(self) -> None:
        check_positive(self, "tp_size", "dp_size", "nnodes")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank must be in [0, {self.nnodes}), got {self.node_rank}")
        if self.nnodes > 1 and not self.dist_init_addr:
            raise ValueError("nnodes > 1 needs --dist-init-addr host:port (reachable from every node)")
