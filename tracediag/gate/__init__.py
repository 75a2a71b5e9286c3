"""`tracediag check` as a library: the rules as a CI gate.

- `config`: the check configuration file (tracediag.toml / [tool.tracediag]), rule selection;
- `judge` and `outcome`: rules judged against --fail-on and the baseline; one outcome per rule,
  expectation and baseline measure;
- `expectations`: facts and rule values compared with what the config expects;
- `baseline`: key measures against a previous run's, within tolerances;
- `run`: the whole check (analysis, judgement, files); `junit` and `annotate`: the JUnit XML and the
  annotated Chrome trace it writes.
"""
