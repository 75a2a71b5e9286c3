"""The inputs of a run, validated once: `Request.build(...)` takes the inputs tracediag.inputspec declares (traces,
model, tp, the side inputs, SLO, bandwidth, peak, TP=1 baseline, graph capture, ranks, keep-python, memory limit,
jobs) with the same types, bounds and one-line errors whoever calls — `tracediag analyze`, `check`, `diff`, the
notebook API, the MCP tools — merges the settings of tracediag.toml (an explicit input wins over the file), and
returns a frozen Request that travels whole through the analysis, the gate and the fleet path.
`Request.context(con, layout, baseline)` is the one place a rule's Context is made."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from tracediag.context import Baseline, Context, Settings, parse_slo
from tracediag.derive.layout import Layout
from tracediag.errors import UsageError
from tracediag.ingest.base import IngestOptions
from tracediag.inputspec import BY_NAME, INPUTS, InputSpec, checked_path
from tracediag.model import ModelConfig, load_model_config

_MAX_BYTES = 1 << 50  # a memory budget beyond any machine


@dataclass(frozen=True)
class Request:
    """A run's inputs, checked. `side_inputs` are (path, format) pairs (logs, scrapes, benchmark results,
    nccl-tests output, topology snapshots); `settings` holds the facts and tolerances (tracediag.context), from
    the explicit inputs over the config file; `config` is the tracediag.toml read (tracediag.gate.config), whose
    check keys (rules, fail_on, expectations) `tracediag check` judges with."""

    traces: tuple[Path, ...] = ()
    model_path: Path | None = None
    model: ModelConfig | None = None
    tp: int | None = None
    side_inputs: tuple[tuple[Path, str], ...] = ()
    settings: Settings = field(default_factory=Settings)
    ranks: str | tuple[int, ...] | None = None  # "all", chosen ranks, or None (the default choice)
    keep_python: bool = False
    memory_limit: int | None = None  # bytes (None: tracediag.memory.DEFAULT_MEMORY_LIMIT)
    jobs: int | None = None
    store: Path | None = None  # a Parquet store made by `tracediag ingest`, read instead of traces
    scheduler: Any = None  # a dask.distributed address or Client, for a store's TP groups
    rules: tuple[str, ...] | None = None  # rule ids to run (None: every registered rule)
    extra_rules: tuple[str, ...] = ()  # rule modules run after the registered ones (development, plugins)
    config: Any = None  # tracediag.gate.config.CheckConfig (None: no file)

    @classmethod
    def build(
        cls,
        traces: Sequence[str | Path] | str | Path | None = (),
        *,
        naming: str = "python",
        config: str | Path | bool | None = False,
        settings: Settings | None = None,
        store: str | Path | None = None,
        scheduler: Any = None,
        rules: Sequence[str] | None = None,
        extra_rules: Sequence[str] = (),
        side_inputs: Sequence[tuple[str | Path, str]] = (),
        **given: Any,
    ) -> Request:
        """Check every input of `given` (tracediag.inputspec.INPUTS by name; None: not given) and build the request.

        `naming` is how an error names an input: "cli" by its flag (--tp), "python" and "mcp" by its argument (tp).
        `config`: a tracediag.toml / pyproject.toml to read, True to find one from the working folder up (as
        `tracediag check` always has), False for none. Its settings apply where no input gives the same fact;
        `settings` (the library's Settings), when given, replaces the file's, and an input given both there and as
        a keyword is an error.
        `side_inputs` are (path, format) pairs given with an explicit format, beside the keyword side inputs."""
        unknown = sorted(set(given) - set(BY_NAME))
        if unknown:
            raise UsageError(f"{', '.join(unknown)}: no such input (inputs: {', '.join(BY_NAME)})")
        values = {"traces": traces} | given
        checked = {name: _check(BY_NAME[name], v, naming) for name, v in values.items() if v is not None}
        cfg = _config(config)
        base = _settings(settings, cfg, checked)
        model_path = checked.get("model")
        if scheduler is not None and store is None:
            raise UsageError(
                "--scheduler runs the rules over a Parquet store: give --store (made by `tracediag ingest`)"
            )
        return cls(
            traces=checked.get("traces", ()),
            model_path=model_path,
            model=load_model_config(model_path) if model_path is not None else None,
            tp=checked.get("tp"),
            side_inputs=tuple((checked_path("side input", p), fmt) for p, fmt in side_inputs)
            + tuple((p, BY_NAME[name].ingest_format) for name in _SIDE for p in checked.get(name, ())),
            settings=base,
            ranks=checked.get("ranks"),
            keep_python=bool(checked.get("keep_python", False)),
            memory_limit=checked.get("memory_limit"),
            jobs=checked.get("jobs"),
            store=Path(store) if store is not None else None,
            scheduler=scheduler,
            rules=tuple(rules) if rules is not None else None,
            extra_rules=tuple(extra_rules),
            config=cfg,
        )

    # --- what the stages read ---------------------------------------------------------------------------
    def with_model(self, model: ModelConfig | None) -> Request:
        """This request with a model config already loaded (the library's `model=ModelConfig(...)`)."""
        return dataclasses.replace(self, model=model)

    def ingest_options(self) -> IngestOptions:
        return IngestOptions(keep_python=self.keep_python, memory_limit=self.memory_limit)

    def read_paths(self) -> list[Path]:
        """Every file the run reads, for the output guard (an output never replaces an input)."""
        s = self.settings
        extra = [Path(p) for p in (s.tp1_baseline, s.graph_capture) if p]
        return [*self.traces, *([self.model_path] if self.model_path else []), *(p for p, _ in self.side_inputs),
                *extra, *([self.store] if self.store else [])]  # fmt: skip

    def baseline(self) -> Baseline | None:
        """The TP=1 baseline of the settings, read within the memory budget when a rule first asks (None: none)."""
        return Baseline(self.settings.tp1_baseline, self.memory_limit) if self.settings.tp1_baseline else None

    def context(self, con: duckdb.DuckDBPyConnection, layout: Layout, baseline: Baseline | None = None) -> Context:
        """What a rule sees on `con`: this request's model and settings, the layout's TP degree, the baseline."""
        return Context(con=con, model=self.model, tp=layout.tp, settings=self.settings, layout=layout,
                       baseline=baseline)  # fmt: skip

    def for_worker(self) -> Request:
        """What a fleet task needs (tracediag.fleet.groups): no scheduler handle, which does not pickle."""
        return dataclasses.replace(self, scheduler=None)


_SIDE = [s.name for s in INPUTS if s.ingest_format is not None]


def _check(spec: InputSpec, v: Any, naming: str) -> Any:
    """One input's value, checked against its kind and bounds; a UsageError naming it as `naming` does."""
    label = spec.flag if naming == "cli" else spec.name
    if spec.kind == "paths":
        items = [v] if isinstance(v, (str, Path)) else v
        if not isinstance(items, (list, tuple)):
            raise UsageError(f"{label}: a path or a list of paths, got {type(v).__name__}")
        return tuple(checked_path(f"{label}[{i}]" if len(items) > 1 else label, p) for i, p in enumerate(items))
    if spec.kind == "path":
        return checked_path(label, v)
    if spec.kind in ("int", "float"):
        return _number(spec, label, v)
    if spec.kind == "bool":
        if not isinstance(v, bool):
            raise UsageError(f"{label}: must be true or false, got {type(v).__name__}")
        return v
    if spec.kind == "size":
        return _size(label, v)
    if not isinstance(v, str) and not (spec.name == "ranks" and isinstance(v, (list, tuple))):
        raise UsageError(f"{label}: must be text, got {type(v).__name__}")
    if spec.name == "slo":
        return _relabel(label, "--slo", lambda: parse_slo(v))
    if spec.name == "ranks":
        return _ranks(label, v)
    return v


def _number(spec: InputSpec, label: str, v: Any) -> int | float:
    lo, hi = spec.bounds
    integral = spec.kind == "int"
    ok = not isinstance(v, bool) and isinstance(v, int if integral else (int, float))
    if not ok or not (math.isfinite(v) and lo <= v <= hi):
        kind = "an integer" if integral else "a number"
        raise UsageError(f"{label}: must be {kind} from {lo:g} to {hi:g}, got {type(v).__name__} {v!r:.40}")
    return int(v) if integral else float(v)


def _size(label: str, v: Any) -> int:
    from tracediag.memory import MIN_MEMORY_LIMIT, parse_size

    if isinstance(v, int) and not isinstance(v, bool):
        if not MIN_MEMORY_LIMIT <= v <= _MAX_BYTES:
            raise UsageError(f"{label}: must be from {MIN_MEMORY_LIMIT >> 20} MiB to 1 PiB in bytes, got {v!r:.40}")
        return v
    if not isinstance(v, str):
        raise UsageError(f"{label}: a size such as 512MiB or 2GiB, got {type(v).__name__}")
    try:
        n = parse_size(v)
    except ValueError as exc:
        raise UsageError(f"{label}: {exc}") from None
    if n > _MAX_BYTES:
        raise UsageError(f"{label}: {v!r:.40} is more memory than any machine has")
    return n


def _ranks(label: str, v: Any) -> str | tuple[int, ...]:
    from tracediag.fleet.ranks import parse_ranks

    if isinstance(v, (list, tuple)):
        if not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < 1 << 31 for r in v):
            raise UsageError(f"{label}: a list of ranks (integers ≥ 0), 'all', or text like 0,3,8-15")
        return tuple(sorted(set(v)))
    out = _relabel(label, "--ranks", lambda: parse_ranks(v))
    return out if isinstance(out, str) else tuple(out)


def _relabel(label: str, flag: str, parse: Any) -> Any:
    """`parse()`, its UsageError naming the input as `label` rather than the CLI's flag."""
    try:
        return parse()
    except UsageError as exc:
        if label == flag:
            raise
        raise UsageError(str(exc).replace(f"{flag}:", f"{label}:", 1)) from None


def _config(config: str | Path | bool | None) -> Any:
    """The CheckConfig of `config` (a file, True: found from the working folder up, False/None: none)."""
    from tracediag.gate.config import CheckConfig, load_config

    if config is False or config is None:
        return CheckConfig()
    return load_config(None if config is True else Path(config))


def _settings(settings: Settings | None, cfg: Any, checked: dict[str, Any]) -> Settings:
    """The run's Settings: the config file's, under the library's `settings`, under the explicit inputs. A path
    the config file gives is relative to the file's folder; an input in both `settings` and a keyword is an
    error (which of the two was meant is not ours to guess)."""
    fields = {
        "slo_ms": checked.get("slo"),
        "hbm_bandwidth_gbs": checked.get("hbm_bandwidth"),
        "peak_tflops": checked.get("peak_tflops"),
        "tp1_baseline": str(checked["tp1_baseline"]) if "tp1_baseline" in checked else None,
        "graph_capture": str(checked["graph_capture"]) if "graph_capture" in checked else None,
    }
    fields = {k: v for k, v in fields.items() if v is not None}
    if settings is not None:
        twice = [k for k in fields if getattr(settings, k) not in (None, ())]
        if twice:
            raise UsageError(f"{', '.join(twice)}: given both in settings and as a keyword argument")
        return dataclasses.replace(settings, **fields)
    base = cfg.settings
    if cfg.path is not None:  # the file's paths are the file's: relative to its folder, not to the working one
        here = Path(cfg.path).parent
        moved = {k: str(here / getattr(base, k)) for k in ("tp1_baseline", "graph_capture")
                 if getattr(base, k) and not Path(getattr(base, k)).is_absolute()}  # fmt: skip
        base = dataclasses.replace(base, **moved)
    return dataclasses.replace(base, **fields)
