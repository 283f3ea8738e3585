"""Paged KV-cache bookkeeping: which fixed-size blocks each sequence owns.

Pure bookkeeping, no tensors: the engine turns block tables into slot numbers. Every TP rank of
a stage runs the same calls in the same order, so their tables agree without being sent.
"""

from __future__ import annotations


class OutOfBlocks(RuntimeError):
    """The cache has no room for a sequence's next tokens."""


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self.block_tables: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, request_id: str, num_tokens: int) -> bool:
        have = len(self.block_tables.get(request_id, ()))
        return self.blocks_needed(num_tokens) - have <= len(self._free)

    def allocate(self, request_id: str, num_tokens: int) -> list[int]:
        """Grow `request_id`'s table to hold `num_tokens` tokens; returns the table."""
        table = self.block_tables.setdefault(request_id, [])
        missing = self.blocks_needed(num_tokens) - len(table)
        if missing > len(self._free):
            if not table:
                del self.block_tables[request_id]
            raise OutOfBlocks(f"sequence {request_id} needs {missing} more KV blocks, "
                              f"{len(self._free)} of {self.num_blocks} are free")
        for _ in range(missing):
            table.append(self._free.pop())
        return table

    def free(self, request_id: str) -> None:
        """Return the sequence's blocks; unknown ids are ignored (a free may arrive twice)."""
        for block in reversed(self.block_tables.pop(request_id, [])):
            self._free.append(block)

    def has(self, request_id: str) -> bool:
        return request_id in self.block_tables

    @property
    def request_ids(self) -> list[str]:
        return list(self.block_tables)
