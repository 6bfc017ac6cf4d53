"""KV memory: the paged pool of K/V tensors with its slot allocator (pool.py), and the cache manager that
shares prefixes through the radix tree, allocates with eviction and releases (cache_manager.py)."""
