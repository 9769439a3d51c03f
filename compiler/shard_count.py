"""How many shards a preprocess split is cut into: the compiler decides it from the corpus
size, so the output is the same on any machine. Standard library only (a dry run reads it).
"""

from __future__ import annotations

MIN_SHARDS = 4
PARALLEL_SHARD_BYTES = 8 << 20   # one shard per 8 MiB ...
PARALLEL_SHARDS = 64             # ... up to 64 shards, enough to keep 32-64 cores busy
MEMORY_SHARD_BYTES = 64 << 20    # at most 64 MiB of text per shard (~200 MB per worker) ...
MAX_SHARDS = 1024                # ... up to 1024 shards (64 GiB); beyond, shards grow
UNKNOWN_SIZE_SHARDS = 64


def auto_num_shards(total_bytes: int | None) -> int:
    """The shard count for a split of ``total_bytes`` of text (None: size unknown).

    Memory: a worker holds one shard's tokens, sentence offsets and instance plan, measured
    at ~1.5 bytes per byte of text (dupe_factor 5), over ~100 MB of interpreter, numpy and
    tokenizer (its word cache is capped); 64 MiB of text per shard keeps a worker near
    200 MB. Below that, shards are for parallelism: one per 8 MiB up to 64 (enough for 32-64
    cores; a shard costs ~2 ms of overhead per phase, so small ones are cheap), at least 4,
    rounded up to a power of two so that 2, 4, 8, ... workers finish together. Capped at
    1024 (then shards grow past 64 MiB). Neither the cost per byte nor the statistics of the
    output depend on the count (each input byte is read once; instances are planned per
    block, with random next segments drawn from the whole split).

        <= 32 MiB: 4;  64 MiB: 8;  256 MiB: 32;  512 MiB .. 4 GiB: 64;  16 GiB: 256;
        >= 64 GiB: 1024;  unknown: 64
    """
    if total_bytes is None:
        return UNKNOWN_SIZE_SHARDS
    total_bytes = max(0, int(total_bytes))
    parallel = min(PARALLEL_SHARDS, -(-total_bytes // PARALLEL_SHARD_BYTES))
    memory = -(-total_bytes // MEMORY_SHARD_BYTES)
    wanted = max(MIN_SHARDS, parallel, memory)
    return min(MAX_SHARDS, 1 << (wanted - 1).bit_length())
