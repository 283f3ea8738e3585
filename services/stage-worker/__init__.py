"""The stage worker: one pod = one tensor-parallel group running one pipeline stage.

Where things happen:
- block_manager.py  which KV-cache blocks each sequence owns (never sees a tensor)
- kv_cache.py       the cache tensors, sized from a memory budget
- engine.py         one stage's model + cache: a StageBatch and its inputs in, hidden or tokens out
- scheduler.py      stage 0's iteration-level batching: which sequences run in the next step
- pipeline.py       all stages of a model in one process (tests, `shardline generate`)
- worker.py         one replica's loop: admission, micro-batches in flight, frees along a route
- outbox.py         its ordered outbound RPCs; convert.py  wire <-> plain objects
- server.py         the gRPC face, registry heartbeat, drain; `python -m shardline.stage_worker`
"""
