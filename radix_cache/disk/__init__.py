"""The disk tier under the radix tree: KV pages in files addressed by their content, bounded, checksummed.

Pure Python (bytes in, bytes out): the runtime gathers K/V from its pool into a payload and writes them back.
"""

from radixlm.radix_cache.disk.keys import block_keys, chain_seed
from radixlm.radix_cache.disk.page_file import CorruptPage, decode_page, encode_header
from radixlm.radix_cache.disk.store import DiskStats, DiskStore
from radixlm.radix_cache.disk.writer import PageWriter

__all__ = ["CorruptPage", "DiskStats", "DiskStore", "PageWriter", "block_keys", "chain_seed", "decode_page",
           "encode_header"]
