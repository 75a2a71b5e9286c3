-- Communication-path inputs: nccl-tests micro-benchmark tables and NVML topology snapshots
-- (`tracediag env`). Units are in column names: *_bytes bytes, *_ns nanoseconds, *_gbs GB/s (1e9 bytes/s),
-- *_mhz MHz. `source_path` is the input file as given (joins inputs.path).

CREATE TABLE nccl_tests (
    source_path VARCHAR,           -- nccl-tests output file as given
    test VARCHAR,                  -- benchmark binary ('all_reduce_perf'), from '# Collective test starting:'; NULL if absent
    op VARCHAR,                    -- collective measured: all_reduce, all_gather, reduce_scatter, broadcast, ...
    nranks INTEGER,                -- ranks in the benchmark (its '#  Rank N Group ...' device lines); NULL if not printed
    placement VARCHAR,             -- 'out-of-place' or 'in-place' (the table's two column groups)
    size_bytes BIGINT,             -- message size per rank ('size'), bytes
    count_elements BIGINT,         -- elements per rank ('count')
    dtype VARCHAR,                 -- element type as nccl-tests writes it ('float', 'half', 'bfloat16', ...)
    redop VARCHAR,                 -- reduction ('sum', 'prod', 'max', 'min', 'avg'; 'none' for non-reducing tests)
    root INTEGER,                  -- root rank ('root' column, -1 when none); NULL in versions without the column
    time_ns BIGINT,                -- time per operation ('time' in µs × 1000), ns
    time_kind VARCHAR,             -- what the time column measured: 'time' (GPU, default) or 'cputime' (-C 1)
    algbw_gbs DOUBLE,              -- algorithm bandwidth = size / time, GB/s
    busbw_gbs DOUBLE,              -- bus bandwidth = algbw × the collective's factor (all-reduce 2(n−1)/n), GB/s
    wrong BIGINT                   -- '#wrong' elements; NULL when 'N/A' or in versions with an 'error' column
);

CREATE TABLE topo_gpus (
    source_path VARCHAR,           -- topology snapshot file as given
    host VARCHAR,                  -- host name the snapshot was taken on
    gpu_index INTEGER,             -- NVML device index (PCI bus order, not CUDA_VISIBLE_DEVICES order)
    name VARCHAR,                  -- nvmlDeviceGetName
    uuid VARCHAR,                  -- nvmlDeviceGetUUID
    pci_bus_id VARCHAR,            -- nvmlDeviceGetPciInfo busId ('00000000:19:00.0')
    memory_total_bytes BIGINT,     -- nvmlDeviceGetMemoryInfo total, bytes
    memory_used_bytes BIGINT,      -- nvmlDeviceGetMemoryInfo used at snapshot time, bytes
    sm_clock_mhz INTEGER,          -- current SM clock, MHz
    sm_clock_max_mhz INTEGER,      -- maximum SM clock, MHz
    mem_clock_mhz INTEGER,         -- current memory clock, MHz
    mem_clock_max_mhz INTEGER,     -- maximum memory clock, MHz
    pcie_gen INTEGER,              -- current PCIe link generation
    pcie_gen_max INTEGER,          -- maximum PCIe link generation of the GPU/slot
    pcie_width INTEGER,            -- current PCIe link width, lanes
    pcie_width_max INTEGER,        -- maximum PCIe link width, lanes
    numa_node INTEGER,             -- NUMA node of the GPU (nvmlDeviceGetNumaNodeId); NULL when not reported
    cpu_affinity VARCHAR,          -- CPUs local to the GPU, as a list ('0-55,112-167')
    nvlinks_total INTEGER,         -- NVLink links the GPU reports (0: no NVLink)
    nvlinks_active INTEGER,        -- of them, in state active
    nvlink_version VARCHAR         -- NVLink version of the active links ('4.0'); NULL without NVLink
);

CREATE TABLE topo_nvlinks (
    source_path VARCHAR,
    host VARCHAR,
    gpu_index INTEGER,             -- NVML device index
    link INTEGER,                  -- link number on the GPU
    state VARCHAR,                 -- 'active', 'inactive', 'sleep', 'active_traffic_disabled'
    version VARCHAR,               -- NVLink version ('4.0')
    remote_pci_bus_id VARCHAR,     -- PCI bus id at the other end of the link
    remote_type VARCHAR,           -- 'gpu', 'switch' (NVSwitch), 'ibmnpu', 'unknown'
    remote_gpu_index INTEGER       -- NVML index of the remote GPU when it is a GPU of this snapshot
);

CREATE TABLE topo_pairs (
    source_path VARCHAR,
    host VARCHAR,
    gpu_a INTEGER,                 -- NVML index of one GPU
    gpu_b INTEGER,                 -- NVML index of the other (gpu_a < gpu_b)
    topology VARCHAR,              -- PCIe common ancestor as nvidia-smi topo -m names it: PIX, PXB, PHB, NODE, SYS, INTERNAL
    p2p_read VARCHAR,              -- nvmlDeviceGetP2PStatus READ: 'ok', 'chipset_not_supported', 'gpu_not_supported', ...
    p2p_write VARCHAR,             -- same, WRITE
    p2p_nvlink VARCHAR,            -- same, NVLINK
    p2p_atomics VARCHAR,           -- same, ATOMICS
    direct_nvlinks INTEGER,        -- active NVLink links from gpu_a to gpu_b directly (not through an NVSwitch)
    link_class VARCHAR,            -- 'nvlink' (direct), 'nvswitch', 'pcie' (P2P over PCIe), 'pcie-host' (no P2P: via host memory)
    expected_busbw_gbs DOUBLE      -- per-direction bandwidth of that path, GB/s (NVLink links × per-link rate, or PCIe lanes × per-lane rate)
);
