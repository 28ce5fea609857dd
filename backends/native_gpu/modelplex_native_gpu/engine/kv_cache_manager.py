"""KVCacheManager: per-request block tables over a BlockPool, with prefix caching.

A full block's key is (hash of the parent key, its token ids, the request's cache_salt); the
dictionary lookup compares the whole key, so a hash collision cannot return wrong tokens.
"""
from __future__ import annotations

from .block_pool import BlockPool, KVCacheBlock
from .request import EngineRequest


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Allocates and frees blocks for requests; the scheduler's only view of KV memory."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.block_pool = BlockPool(num_blocks, enable_prefix_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_blocks: dict[str, int] = {}  # blocks already registered in the cache
        self.num_prefix_queries = 0  # prompt tokens looked up
        self.num_prefix_hits = 0  # of which found in the cache

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.num_prefix_hits / self.num_prefix_queries if self.num_prefix_queries else 0.0

    def block_table(self, request_id: str) -> list[int]:
        return [block.block_id for block in self.req_to_blocks.get(request_id, ())]

    def _update_block_hashes(self, request: EngineRequest):
        """Extend request.block_hashes to every full block of its known tokens."""
        bs, hashes, tokens = self.block_size, request.block_hashes, request.all_token_ids
        for i in range(len(hashes), len(tokens) // bs):
            parent = hash(hashes[-1]) if hashes else None
            hashes.append((parent, tuple(tokens[i * bs:(i + 1) * bs]), request.cache_salt))

    def get_computed_blocks(self, request: EngineRequest) -> tuple[list[KVCacheBlock], int]:
        """Longest chain of cached full blocks for a request that holds no blocks yet.

        At least the last token is left to compute so the step produces logits to sample from.
        """
        if not self.enable_prefix_caching:
            return [], 0
        self._update_block_hashes(request)
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits = []
        for block_hash in request.block_hashes[:max_hit_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def record_prefix_lookup(self, num_tokens: int, num_hit_tokens: int):
        """Count one admitted request's lookup (not retries of a request that did not fit)."""
        if self.enable_prefix_caching:
            self.num_prefix_queries += num_tokens
            self.num_prefix_hits += num_hit_tokens

    def allocate_slots(self, request: EngineRequest, num_new_tokens: int,
                       new_computed_blocks: list[KVCacheBlock] = ()) -> bool:
        """Give `request` room for `num_new_tokens` more tokens (after any prefix hits).

        Returns False, changing nothing, when the pool cannot supply the blocks.
        """
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        num_needed = cdiv(num_computed + num_new_tokens, self.block_size) - len(blocks) - len(new_computed_blocks)
        # Hits that sit in the free queue stop being allocatable once touched.
        num_evictable_hits = sum(1 for block in new_computed_blocks if block.ref_cnt == 0)
        if num_needed > self.block_pool.num_free_blocks - num_evictable_hits:
            if not blocks:
                del self.req_to_blocks[request.request_id]
            return False
        self.block_pool.touch(new_computed_blocks)
        blocks.extend(new_computed_blocks)
        if num_needed > 0:
            blocks.extend(self.block_pool.get_new_blocks(num_needed))
        if self.enable_prefix_caching:
            self._cache_full_blocks(request, min(num_computed + num_new_tokens, request.num_tokens))
        return True

    def _cache_full_blocks(self, request: EngineRequest, num_tokens: int):
        """Register blocks whose tokens are all computed by the end of this step."""
        self._update_block_hashes(request)
        blocks = self.req_to_blocks[request.request_id]
        start = self.num_cached_blocks.get(request.request_id, 0)
        end = num_tokens // self.block_size
        for i in range(start, end):
            self.block_pool.cache_block(blocks[i], request.block_hashes[i])
        self.num_cached_blocks[request.request_id] = max(start, end)

    def free(self, request: EngineRequest):
        """Release all of a request's blocks; tail blocks first so they are evicted first."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_blocks.pop(request.request_id, None)
        self.block_pool.free_blocks(reversed(blocks))

    def num_allocated_slots(self) -> int:
        return sum(len(blocks) for blocks in self.req_to_blocks.values()) * self.block_size
