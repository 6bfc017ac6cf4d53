"""Radix prefix cache: a pure-Python tree over token ids whose values are KV slot indices."""

from radixlm.radix_cache.eviction import EvictionPolicy, LFUPolicy, LRUPolicy
from radixlm.radix_cache.node import TreeNode
from radixlm.radix_cache.tree import MatchResult, RadixCache, SizeInfo

__all__ = ["EvictionPolicy", "LFUPolicy", "LRUPolicy", "MatchResult", "RadixCache", "SizeInfo", "TreeNode"]
