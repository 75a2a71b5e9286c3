"""Walk step 6, scheduling and queueing: the serving engine's phases, queues, KV cache, stalls and SLOs."""
