-- requires: cpu_ops, kernels, steps, steps.T
-- provides: eager_cpu_ops
-- late: sorts every CPU op of a CPU-only trace: a transaction of its own, after the others
--
-- KRN008 on CPU-only traces (no GPU kernels anywhere): the outermost eager elementwise CPU ops inside engine
-- steps, per rank, step and op name. "Outermost": not nested in an earlier elementwise or classified op of the
-- same thread (an aten::to calls aten::_to_copy, which calls aten::copy_: one pass, counted once). Built here
-- rather than in the rule so that a Parquet store holds it and `analyze --store` does not sort every op again;
-- empty on traces with GPU kernels (the rule reads kernel_steps there).
CREATE OR REPLACE TEMP MACRO eager_cpu_op(op_name) AS op_name IN (
    'aten::add', 'aten::add_', 'aten::mul', 'aten::mul_', 'aten::sub', 'aten::div', 'aten::pow', 'aten::mean',
    'aten::rsqrt', 'aten::sqrt', 'aten::silu', 'aten::gelu', 'aten::relu', 'aten::sigmoid', 'aten::tanh',
    'aten::neg', 'aten::cat', 'aten::sin', 'aten::cos', 'aten::to', 'aten::_to_copy', 'aten::copy_',
    'aten::contiguous', 'aten::clone', 'aten::exp', 'aten::where', 'aten::masked_fill', 'aten::var'
);

CREATE OR REPLACE TABLE eager_cpu_ops AS
WITH ops AS (
    SELECT o.rank, o.tid, o.name, o.ts_ns, o.dur_ns,
           max(o.ts_ns + o.dur_ns) OVER (PARTITION BY o.rank, o.tid ORDER BY o.ts_ns, o.dur_ns DESC
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS enclosing_end
    FROM cpu_ops o
    WHERE (SELECT count(*) FROM kernels) = 0
      AND (eager_cpu_op(o.name) OR (o.klass IS NOT NULL AND o.klass <> 'other'))
)
SELECT o.rank,                          -- global rank
       s.step_id,                       -- engine step (steps.step_id) holding the op's start
       o.name,                          -- eager op name (aten::add, aten::mul, aten::to, ...)
       count(*) AS calls,               -- outermost calls of the op in the step
       sum(o.dur_ns) AS time_ns,        -- their summed host time, ns
       min(o.ts_ns) AS first_ts_ns      -- host start of the first, ns
FROM ops o JOIN steps s ON s.rank = o.rank AND o.ts_ns >= s.ts_ns AND o.ts_ns < s.ts_ns + s.dur_ns
WHERE eager_cpu_op(o.name) AND (o.enclosing_end IS NULL OR o.enclosing_end < o.ts_ns + o.dur_ns)
GROUP BY o.rank, s.step_id, o.name;

DROP MACRO IF EXISTS temp.eager_cpu_op;
