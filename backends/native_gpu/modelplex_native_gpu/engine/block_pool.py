"""BlockPool: the KV-cache blocks, an O(1) LRU free queue and the prefix-cache hash table.

Block 0 is the reserved null block (padding in block tables); it is never handed out.
A free block may still hold a cached hash: it is evicted only when reused, so the free queue order is
(nearly) the eviction order, least recently freed first.

Blocks are handed out in runs of ascending ids where the free blocks allow it: the CPU decode attention
reads a sequence's blocks in table order, and adjacent ascending blocks stream (hardware prefetch) where
scattered or descending ones do not (1.5-2.2x slower at 1 thread on Zen 5). Plain LRU order scatters every
table once the queue has been cycled (a second run of the same batch: 1.6 blocks per contiguous run
instead of 2.1, later 1.0). So a table grows into the block after its last one when that block is free and
"cold" (uncached, or freed about as long ago as the older half of the queue); a run started from the
queue's front begins at the bottom of the free gap around it and soft-reserves the blocks after it for the
table's expected growth (moves them to the back, where other requests reach them last). Cached blocks are
thus evicted out of LRU order only among the colder half of the free queue.
"""
from __future__ import annotations

from collections.abc import Iterable


class KVCacheBlock:
    """One block of `block_size` token slots. `block_hash` is written once when the block is full."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free", "next_free", "freed_at", "is_reserved")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: tuple | None = None
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None
        self.freed_at = 0  # the pool's free count when it was last freed: the age of its cached content
        self.is_reserved = False  # free, and kept for the growth of the table that ends before it

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, cached={self.block_hash is not None})"


class FreeBlockQueue:
    """Intrusive doubly linked list of free blocks: O(1) popleft, append and remove from the middle."""

    def __init__(self, blocks: Iterable[KVCacheBlock]):
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def front(self) -> KVCacheBlock | None:
        block = self._head.next_free
        return None if block is self._tail else block

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free
        assert block is not self._tail, "popleft on an empty free queue"
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock):
        block.prev_free.next_free = block.next_free
        block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock):
        last = self._tail.prev_free
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def block_ids(self) -> list[int]:
        """Front (next to evict) to back; for tests and debugging."""
        ids, block = [], self._head.next_free
        while block is not self._tail:
            ids.append(block.block_id)
            block = block.next_free
        return ids


class BlockPool:
    """Owns all blocks. Invariant: num_free_blocks + num_used_blocks == num_blocks - 1 (the null block)."""

    def __init__(self, num_blocks: int, enable_caching: bool = True):
        assert num_blocks >= 2, "need the null block and at least one usable block"
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.ref_cnt = 1  # pinned forever
        self.free_queue = FreeBlockQueue(self.blocks[1:])
        self.cached_blocks: dict[tuple, KVCacheBlock] = {}
        for block in self.blocks:  # as if freed in queue order
            block.freed_at = block.block_id
        self._num_frees = num_blocks  # stamps freed blocks (KVCacheBlock.freed_at)

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - 1 - self.free_queue.num_free_blocks

    def get_cached_block(self, block_hash: tuple) -> KVCacheBlock | None:
        return self.cached_blocks.get(block_hash)

    def get_new_blocks(self, num_blocks: int, after: KVCacheBlock | None = None,
                       reserve: int = 0) -> list[KVCacheBlock]:
        """`num_blocks` free blocks (ref_cnt 1, cached hashes evicted) for a table ending in `after`: first
        the blocks following `after` while they are free and cold, then runs from the front of the queue,
        each popped block followed by its free, cold, unreserved successors. When a run was started from the
        front, up to `reserve` free, cold blocks after the last one are soft-reserved for the table."""
        assert num_blocks <= self.num_free_blocks, "caller must check num_free_blocks first"
        new_blocks: list[KVCacheBlock] = []
        if after is not None:
            self._extend(new_blocks, after.block_id + 1, num_blocks, take_reserved=True)
        started = False
        while len(new_blocks) < num_blocks:
            block = self._run_start(self.free_queue.front(), num_blocks - len(new_blocks) + reserve)
            self.free_queue.remove(block)
            self._claim(block)
            new_blocks.append(block)
            started = True
            self._extend(new_blocks, block.block_id + 1, num_blocks, take_reserved=False)
        if started and reserve:
            self._reserve(new_blocks[-1].block_id + 1, reserve)
        return new_blocks

    def _is_cold(self, block: KVCacheBlock) -> bool:
        """Free, and holding no cached hash or one freed before about the older half of the free queue."""
        if block.ref_cnt:
            return False
        if block.block_hash is None:
            return True
        return block.freed_at - self.free_queue.front().freed_at < self.num_free_blocks // 2

    def _run_start(self, front: KVCacheBlock, span: int) -> KVCacheBlock:
        """Where a run through the queue's front block starts: up to span - 1 free, cold, unreserved blocks
        lower (the queue holds a finished table's blocks tail first, so its front is often a run's top)."""
        block_id = front.block_id
        while front.block_id - block_id < span - 1 and block_id > 1:
            below = self.blocks[block_id - 1]
            if below.is_reserved or not self._is_cold(below):
                break
            block_id -= 1
        return self.blocks[block_id]

    def _claim(self, block: KVCacheBlock):
        """A block just taken off the free queue: evict its hash, one reference."""
        if block.block_hash is not None:
            del self.cached_blocks[block.block_hash]
            block.block_hash = None
        block.ref_cnt = 1
        block.is_reserved = False

    def _extend(self, new_blocks: list[KVCacheBlock], block_id: int, num_blocks: int, take_reserved: bool):
        while len(new_blocks) < num_blocks and block_id < self.num_blocks:
            block = self.blocks[block_id]
            if not self._is_cold(block) or (block.is_reserved and not take_reserved):
                return
            self.free_queue.remove(block)
            self._claim(block)
            new_blocks.append(block)
            block_id += 1

    def _reserve(self, block_id: int, count: int):
        """Move up to `count` free, cold, unreserved blocks from `block_id` on to the back of the queue."""
        for i in range(block_id, min(block_id + count, self.num_blocks)):
            block = self.blocks[i]
            if block.is_reserved or not self._is_cold(block):
                return
            block.is_reserved = True
            self.free_queue.remove(block)
            self.free_queue.append(block)

    def release_reservation(self, last: KVCacheBlock):
        """A table ending in `last` is gone: the free blocks it had reserved after `last` are unreserved."""
        for i in range(last.block_id + 1, self.num_blocks):
            block = self.blocks[i]
            if not (block.is_reserved and block.ref_cnt == 0):
                return
            block.is_reserved = False

    def touch(self, blocks: Iterable[KVCacheBlock]):
        """Take a reference on prefix-cache hits; a hit with ref_cnt 0 leaves the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
                block.is_reserved = False
            block.ref_cnt += 1

    def free_blocks(self, blocks: Iterable[KVCacheBlock]):
        """Drop one reference each; blocks reaching 0 go to the back of the queue in the given order."""
        for block in blocks:
            assert block.ref_cnt > 0 and block is not self.null_block
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                block.freed_at = self._num_frees
                self._num_frees += 1
                self.free_queue.append(block)

    def cache_block(self, block: KVCacheBlock, block_hash: tuple):
        """Register a full, computed block under its hash; the first block with a hash wins."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash not in self.cached_blocks:
            block.block_hash = block_hash
            self.cached_blocks[block_hash] = block

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; only possible when no block is in use."""
        if self.num_used_blocks:
            return False
        for block in self.cached_blocks.values():
            block.block_hash = None
        self.cached_blocks.clear()
        return True
