"""KVCacheManager: per-request block tables (one per KV-cache group) over a BlockPool, with prefix caching.

A full block's key is (group, (hash of the parent key, its token ids, the request's cache_salt)); the
dictionary lookup compares the whole key, so a hash collision cannot return wrong tokens.
"""
from __future__ import annotations

from .block_pool import BlockPool, KVCacheBlock
from .kv_cache_groups import KVCacheGroup
from .request import EngineRequest

MAX_RESERVED_BLOCKS = 64  # a table's soft reservation (engine/block_pool.py), at most 1024 tokens at 16


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Allocates and frees blocks for requests; the scheduler's only view of KV memory.

    Each request holds one block table per KV-cache group (kv_cache_groups.py), all from one BlockPool.
    A sliding-window group's blocks that fall out of its window are handed back (their table entries
    become the null block); they keep their prefix-cache hash until reused, so a later request can still
    hit them. A prefix hit must cover, in every group, the blocks the next token reads.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 groups: list[KVCacheGroup] | None = None):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.groups = groups or [KVCacheGroup(())]
        self.block_pool = BlockPool(num_blocks, enable_prefix_caching)
        self.req_to_blocks: dict[str, list[list[KVCacheBlock]]] = {}  # request -> per group, null = freed
        self.num_cached_blocks: dict[str, int] = {}  # blocks already registered in the cache (every group)
        self.num_skipped_blocks: dict[str, list[int]] = {}  # per group: leading blocks handed back
        # block_tables() per request, rebuilt after its tables change (never mutated: outputs keep them)
        self._block_ids: dict[str, list[list[int]]] = {}
        # One full-attention group: a request whose blocks already hold its new tokens needs nothing more
        self._has_fast_path = len(self.groups) == 1 and self.groups[0].sliding_window is None
        self.num_prefix_queries = 0  # prompt tokens looked up
        self.num_prefix_hits = 0  # of which found in the cache

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.num_prefix_hits / self.num_prefix_queries if self.num_prefix_queries else 0.0

    def block_table(self, request_id: str, group: int = 0) -> list[int]:
        blocks = self.req_to_blocks.get(request_id)
        return [block.block_id for block in blocks[group]] if blocks else []

    def block_tables(self, request_id: str) -> list[list[int]]:
        """One block table per group (the scheduler's output carries them to the runner). The lists are
        shared between calls until the request's blocks change, and must not be mutated."""
        ids = self._block_ids.get(request_id)
        if ids is None:
            ids = [self.block_table(request_id, g) for g in range(len(self.groups))]
            if request_id in self.req_to_blocks:
                self._block_ids[request_id] = ids
        return ids

    def _update_block_hashes(self, request: EngineRequest):
        """Extend request.block_hashes to every full block of its known tokens."""
        bs, hashes, tokens = self.block_size, request.block_hashes, request.all_token_ids
        for i in range(len(hashes), len(tokens) // bs):
            parent = hash(hashes[-1]) if hashes else None
            hashes.append((parent, tuple(tokens[i * bs:(i + 1) * bs]), request.cache_salt))

    def get_computed_blocks(self, request: EngineRequest) -> tuple[list[list[KVCacheBlock]], int]:
        """Longest prefix of cached full blocks for a request that holds no blocks yet: per group, the
        blocks (the null block where a sliding group needs none), and the number of hit tokens.

        At least the last token is left to compute so the step produces logits to sample from.
        """
        if not self.enable_prefix_caching:
            return [[] for _ in self.groups], 0
        self._update_block_hashes(request)
        hashes, num_hit = request.block_hashes, (request.num_tokens - 1) // self.block_size
        while True:  # each group may shorten the hit; stop when every group accepts it
            bound = num_hit
            for g in range(len(self.groups)):
                num_hit = self._longest_hit(g, hashes, num_hit)
            if num_hit == bound:
                break
        get, null = self.block_pool.get_cached_block, self.block_pool.null_block
        hits = []
        for g, group in enumerate(self.groups):
            first = group.first_needed_block(num_hit * self.block_size, self.block_size)
            hits.append([null] * first + [get((g, hashes[i])) for i in range(first, num_hit)])
        return hits, num_hit * self.block_size

    def _longest_hit(self, g: int, hashes: list[tuple], bound: int) -> int:
        """Largest n <= bound such that group g has cached every block the token after n blocks reads."""
        group, get = self.groups[g], self.block_pool.get_cached_block
        n = bound
        while n > 0:
            first = group.first_needed_block(n * self.block_size, self.block_size)
            missing = next((i for i in range(n - 1, first - 1, -1) if get((g, hashes[i])) is None), None)
            if missing is None:
                return n
            n = missing
        return 0

    def record_prefix_lookup(self, num_tokens: int, num_hit_tokens: int):
        """Count one admitted request's lookup (not retries of a request that did not fit)."""
        if self.enable_prefix_caching:
            self.num_prefix_queries += num_tokens
            self.num_prefix_hits += num_hit_tokens

    def allocate_slots(self, request: EngineRequest, num_new_tokens: int,
                       new_computed_blocks: list[list[KVCacheBlock]] | None = None) -> bool:
        """Give `request` room for `num_new_tokens` more tokens (after any prefix hits), first handing back
        the blocks its sliding-window groups no longer read.

        Returns False, allocating nothing, when the pool cannot supply the blocks.
        """
        tables = self.req_to_blocks.get(request.request_id)
        if tables is not None and new_computed_blocks is None and self._has_fast_path:
            # Most decode steps: the tokens fit in the request's blocks and fill no block to register.
            num_end = request.num_computed_tokens + num_new_tokens
            if num_end <= len(tables[0]) * self.block_size and (
                    not self.enable_prefix_caching
                    or min(num_end, request.num_tokens) // self.block_size
                    <= self.num_cached_blocks.get(request.request_id, 0)):
                return True
        self._block_ids.pop(request.request_id, None)  # its tables may change below
        null = self.block_pool.null_block
        hits = new_computed_blocks or [[] for _ in self.groups]
        num_computed = request.num_computed_tokens + len(hits[0]) * self.block_size
        if tables is not None:
            self._free_skipped_blocks(request.request_id, tables, num_computed)
        num_total_blocks = cdiv(num_computed + num_new_tokens, self.block_size)
        num_needed = [max(0, num_total_blocks - len(hits[g]) - (len(tables[g]) if tables else 0))
                      for g in range(len(self.groups))]
        # Hits that sit in the free queue stop being allocatable once touched.
        num_evictable_hits = sum(1 for blocks in hits for block in blocks if block.ref_cnt == 0)
        if sum(num_needed) > self.block_pool.num_free_blocks - num_evictable_hits:
            return False
        if tables is None:
            tables = self.req_to_blocks[request.request_id] = [[] for _ in self.groups]
            self.num_skipped_blocks[request.request_id] = [blocks.count(null) for blocks in hits]
        for g, blocks in enumerate(tables):  # hits leave the free queue before any block is popped from it
            self.block_pool.touch(block for block in hits[g] if block is not null)
            blocks.extend(hits[g])
        # The blocks the request will still need if it runs to max_tokens: reserved after a new run of blocks.
        num_expected = cdiv(request.num_prompt_tokens + request.sampling_params.max_tokens, self.block_size)
        reserve = min(max(0, num_expected - num_total_blocks), MAX_RESERVED_BLOCKS)
        for g, blocks in enumerate(tables):
            if num_needed[g]:
                last = next((block for block in reversed(blocks) if block is not null), None)
                blocks.extend(self.block_pool.get_new_blocks(num_needed[g], after=last, reserve=reserve))
        if self.enable_prefix_caching:
            self._cache_full_blocks(request, min(num_computed + num_new_tokens, request.num_tokens))
        return True

    def _free_skipped_blocks(self, request_id: str, tables: list[list[KVCacheBlock]], num_computed: int):
        """Hand back sliding-window blocks that no token from position `num_computed` on reads."""
        null, skipped = self.block_pool.null_block, self.num_skipped_blocks[request_id]
        for g, group in enumerate(self.groups):
            first = min(group.first_needed_block(num_computed, self.block_size), len(tables[g]))
            if first <= skipped[g]:
                continue
            blocks = tables[g]
            freed = [blocks[i] for i in range(skipped[g], first) if blocks[i] is not null]
            blocks[skipped[g]:first] = [null] * (first - skipped[g])
            skipped[g] = first
            self.block_pool.free_blocks(freed)

    def _cache_full_blocks(self, request: EngineRequest, num_tokens: int):
        """Register blocks whose tokens are all computed by the end of this step, under (group, hash)."""
        self._update_block_hashes(request)
        tables, null = self.req_to_blocks[request.request_id], self.block_pool.null_block
        start = self.num_cached_blocks.get(request.request_id, 0)
        end = num_tokens // self.block_size
        for g, blocks in enumerate(tables):
            for i in range(start, end):
                if blocks[i] is not null:
                    self.block_pool.cache_block(blocks[i], (g, request.block_hashes[i]))
        self.num_cached_blocks[request.request_id] = max(start, end)

    def free(self, request: EngineRequest):
        """Release all of a request's blocks; tail blocks first so they are evicted first."""
        tables = self.req_to_blocks.pop(request.request_id, [])
        self._block_ids.pop(request.request_id, None)
        self.num_cached_blocks.pop(request.request_id, None)
        self.num_skipped_blocks.pop(request.request_id, None)
        null = self.block_pool.null_block
        for blocks in tables:
            self.block_pool.free_blocks(block for block in reversed(blocks) if block is not null)
            if blocks and blocks[-1] is not null:
                self.block_pool.release_reservation(blocks[-1])
