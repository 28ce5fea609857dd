"""BlockPool: the KV-cache blocks, an O(1) LRU free queue and the prefix-cache hash table.

Block 0 is the reserved null block (padding in block tables); it is never handed out.
A free block may still hold a cached hash: it is evicted only when popped for reuse,
so the free queue order is the eviction order (least recently freed first).
"""
from __future__ import annotations

from collections.abc import Iterable


class KVCacheBlock:
    """One block of `block_size` token slots. `block_hash` is written once when the block is full."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free", "next_free")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: tuple | None = None
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None

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

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - 1 - self.free_queue.num_free_blocks

    def get_cached_block(self, block_hash: tuple) -> KVCacheBlock | None:
        return self.cached_blocks.get(block_hash)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop `num_blocks` from the front of the free queue, evicting their cached hashes."""
        assert num_blocks <= self.num_free_blocks, "caller must check num_free_blocks first"
        new_blocks = []
        for _ in range(num_blocks):
            block = self.free_queue.popleft()
            if block.block_hash is not None:
                del self.cached_blocks[block.block_hash]
                block.block_hash = None
            block.ref_cnt = 1
            new_blocks.append(block)
        return new_blocks

    def touch(self, blocks: Iterable[KVCacheBlock]):
        """Take a reference on prefix-cache hits; a hit with ref_cnt 0 leaves the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, blocks: Iterable[KVCacheBlock]):
        """Drop one reference each; blocks reaching 0 go to the back of the queue in the given order."""
        for block in blocks:
            assert block.ref_cnt > 0 and block is not self.null_block
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
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
