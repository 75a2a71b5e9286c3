-- Nsight Systems detail the canonical tables have no place for (filled by tracediag/ingest/nsys/).
-- Every NVTX range also lands in cpu_ops (PyTorch emit_nvtx ranges) or annotations (source 'nvtx');
-- this table keeps what those drop: domain, range style, marks, PyTorch seq/op_id and the decoded
-- NVTX payload (NCCL writes message size, reduction op and communicator there).

CREATE TABLE nvtx_events (
    rank INTEGER,                  -- global rank of the process (and GPU) that emitted the event
    name VARCHAR,                  -- NVTX message (text or registered string) verbatim (untrusted text)
    kind VARCHAR,                  -- 'push_pop', 'start_end' (range that may end on another thread) or 'mark'
    domain_id BIGINT,              -- NVTX domain id (0 = default domain)
    domain VARCHAR,                -- domain name from its nvtxDomainCreate event ('NCCL', 'MPI'), NULL if not captured
    ts_ns BIGINT,                  -- host start, ns
    dur_ns BIGINT,                 -- host duration, ns (NULL for marks; open ranges end at the trace end)
    pid VARCHAR,                   -- process id (globalTid >> 24 & 0xFFFFFF)
    tid VARCHAR,                   -- thread id that started the range (globalTid & 0xFFFFFF)
    end_tid VARCHAR,               -- thread that ended a start/end range when it is another one, else NULL
    category INTEGER,              -- NVTX category id
    color BIGINT,                  -- ARGB color
    stored_as VARCHAR,             -- where the range also went: 'cpu_ops', 'annotations' (NULL for marks)
    torch_seq BIGINT,              -- PyTorch emit_nvtx 'seq = N' (autograd sequence number)
    torch_op_id BIGINT,            -- PyTorch emit_nvtx 'op_id = M' (= cpu_ops.external_id of the op)
    nccl_comm_id VARCHAR,          -- NCCL payload 'NCCL communicator ID', hex
    message_bytes BIGINT,          -- NCCL payload 'Message size [bytes]', bytes
    reduction_op VARCHAR,          -- NCCL payload 'Reduction operation' (sum, prod, max, min, avg)
    peer INTEGER,                  -- NCCL payload 'Peer rank' (send/recv)
    root INTEGER,                  -- NCCL payload 'Root' (broadcast/reduce)
    nranks INTEGER,                -- NCCL payload 'No. of ranks' (communicator init/destroy)
    nccl_rank INTEGER,             -- NCCL payload 'Rank' (communicator init/destroy)
    cuda_device INTEGER,           -- NCCL payload 'CUDA device' (communicator init/destroy)
    payload_json VARCHAR           -- every decoded payload entry by its schema label, JSON (NULL when none)
);

CREATE TABLE gpu_sync (
    rank INTEGER,                  -- global rank
    name VARCHAR,                  -- 'Event Sync', 'Stream Wait Event', 'Stream Sync', 'Context Sync' (Kineto's names)
    ts_ns BIGINT,                  -- start, ns
    dur_ns BIGINT,                 -- duration, ns
    device INTEGER,                -- GPU ordinal
    stream BIGINT,                 -- stream id (CUPTI writes 0xFFFFFFFF when not applicable)
    correlation BIGINT,            -- the synchronizing API call's correlation id (runtime.correlation)
    event_id BIGINT                -- CUDA event waited on (event syncs), else CUPTI's invalid id
);
