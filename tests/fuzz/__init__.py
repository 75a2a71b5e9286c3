"""Mutation fuzzing of every input tracediag reads, seeded from the real files in the repository.

- `seeds.py`: the real seed files per input kind (tests/data/external/, sample_traces/, tests/data/).
- `mutate.py`: mutators (JSON values and structure, text lines and numbers, SQLite cells/tables/pages, bytes)
  driven by a `random.Random`, so hypothesis can draw and shrink them and the long run can replay a seed.
- `harness.py`: runs one mutated input through its target (ingester, model config, check config, the CLI)
  and classifies the outcome: ok, input error (one line naming the file), or a defect.

The budgeted run is `tests/test_fuzz.py` (part of the normal suite); the long run with hang and
partial-output accounting is `benchmarks/fuzz_long.py` (see benchmarks/README.md).
"""
