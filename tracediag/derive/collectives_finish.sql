-- Step of each collective call: the step whose host range holds the call's host start (or, for a
-- kernel with no host launch in the trace, whose GPU window holds the kernel).
UPDATE collectives SET step_id = s.step_id
FROM steps s
WHERE s.rank = collectives.rank
  AND collectives.anchor_ts_ns >= s.ts_ns AND collectives.anchor_ts_ns < s.ts_ns + s.dur_ns;

UPDATE collectives SET step_id = s.step_id
FROM steps s
WHERE collectives.step_id IS NULL AND collectives.cpu_dur_ns IS NULL AND s.rank = collectives.rank
  AND collectives.gpu_ts_ns >= s.gpu_ts_ns AND collectives.gpu_ts_ns < s.gpu_end_ns;

-- Per rank per step per op: counts and payloads (what COL001/COL002 read).
CREATE OR REPLACE VIEW step_collectives AS
SELECT c.rank, c.step_id, s.T, s.phase, c.op, c.group_size,
       count(*) AS calls,                                  -- collective calls in the step
       sum(c.payload_bytes) AS payload_bytes,              -- summed per-rank input bytes
       min(c.payload_bytes) AS min_payload_bytes,
       max(c.payload_bytes) AS max_payload_bytes,
       sum(c.dur_ns) AS dur_ns                             -- summed call time (GPU where a kernel ran)
FROM collectives c LEFT JOIN steps s USING (rank, step_id)
GROUP BY ALL;
