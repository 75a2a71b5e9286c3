"""Counters over the run, not since the server started: `curl /metrics` before and after a benchmark (two files,
or one file of both scrapes, no timestamps) is differenced between the scrapes; one scrape is labelled "since
server start"; a counter that falls (a restart) breaks the difference and says so. Also: an idle scrape is not
the run's KV usage (SCH004), SGLang's server_args give SCH007 its k, and SCH004/SCH006 impacts have a basis.

The served exposition is written by prometheus_client itself (`generate_latest` of a registry with vLLM's metric
names and labels: vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py) and fetched over HTTP like `curl`
does, with no marker and no timestamp. Every expected number is recomputed from the files with
prometheus_client's own parser, not taken from tracediag.
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_scrape import Server

from tracediag.analysis import analyze
from tracediag.ingest.base import IngestOptions
from tracediag.ingest.prometheus import parse_prometheus

EXT = REPO / "tests" / "data" / "external"
RULES = [
    "tracediag.rules.step6_scheduling.sch004_kv_pressure",
    "tracediag.rules.step6_scheduling.sch006_prefix_cache",
    "tracediag.rules.step6_scheduling.sch007_speculative_decoding",
]


class BenchServer:
    """vLLM's counters with a lifetime before the benchmark (warm-up traffic, 90 % prefix reuse) and a run that
    reuses 8 %: the lifetime passes SCH006, the run does not. Gauges read 0 running, 0 waiting: idle scrapes."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        lab = ["model_name", "engine"]
        r = self.registry
        self.running = Gauge("vllm:num_requests_running", "Running.", lab, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Waiting.", lab, registry=r)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", lab, registry=r)
        self.preempt = Counter("vllm:num_preemptions", "Cumulative number of preemption.", lab, registry=r)
        self.success = Counter("vllm:request_success", "Finished requests.", [*lab, "finished_reason"], registry=r)
        self.queries = Counter("vllm:prefix_cache_queries", "Prefix cache queries (tokens).", lab, registry=r)
        self.hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits (tokens).", lab, registry=r)
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Drafts.", lab, registry=r)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Draft tokens.", lab, registry=r)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Accepted.", lab, registry=r)
        self.per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted per position.", [*lab, "position"], registry=r
        )
        lv = ("m", "0")
        for g in (self.running, self.waiting, self.kv):
            g.labels(*lv).set(0)

    def traffic(self, queries, hits, drafts, accepted_per_pos, preemptions, finished) -> None:
        lv = ("m", "0")
        self.queries.labels(*lv).inc(queries)
        self.hits.labels(*lv).inc(hits)
        self.drafts.labels(*lv).inc(drafts)
        self.draft_tokens.labels(*lv).inc(drafts * len(accepted_per_pos))
        self.accepted.labels(*lv).inc(sum(accepted_per_pos))
        for i, n in enumerate(accepted_per_pos):
            self.per_pos.labels(*lv, str(i)).inc(n)
        self.preempt.labels(*lv).inc(preemptions)
        self.success.labels(*lv, "stop").inc(finished)

    def render(self) -> bytes:
        return generate_latest(self.registry)


WARMUP = {
    "queries": 1000,
    "hits": 900,
    "drafts": 100,
    "accepted_per_pos": (90, 80, 70),
    "preemptions": 5,
    "finished": 50,
}
RUN = {"queries": 4000, "hits": 320, "drafts": 1000, "accepted_per_pos": (800, 450, 250), "preemptions": 12,
       "finished": 200}  # fmt: skip
AFTER_RESTART = {"queries": 500, "hits": 40, "drafts": 50, "accepted_per_pos": (40, 20, 10), "preemptions": 1,
                 "finished": 10}  # fmt: skip


def _curl(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:  # a plain GET: no marker, no timestamp
        return resp.read().decode()


def _totals(text: str) -> dict[tuple[str, str], float]:
    """(sample name, position label) -> value, by prometheus_client's parser: the reference numbers."""
    out: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, s.labels.get("position", ""))
            out[key] = out.get(key, 0.0) + s.value
    return out


def _check(report, rule):
    (c,) = [c for c in report.checks if c.rule == rule]
    return c


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory):
    """before.prom / after.prom around one run of a live server, both.prom their concatenation, and restart.prom:
    the before scrape, then a scrape of the server restarted (its counters below the first scrape's)."""
    d = tmp_path_factory.mktemp("scrapes")
    srv = Server()
    srv.fake = BenchServer()
    try:
        srv.fake.traffic(**WARMUP)
        before = _curl(srv.url)
        srv.fake.traffic(**RUN)
        after = _curl(srv.url)
        srv.fake = BenchServer()  # the process restarted: its counters began again from 0, and served a little
        srv.fake.traffic(**AFTER_RESTART)
        restarted = _curl(srv.url)
    finally:
        srv.stop()
    files = {"before": before, "after": after, "both": before + after, "restart": before + restarted}
    for name, text in files.items():
        (d / f"{name}.prom").write_text(text)
    return d, {name: text for name, text in files.items()}


def _analyze(*paths: Path):
    return analyze([], extra_inputs=[(p, "prometheus") for p in paths], extra_rules=RULES)


def test_concatenated_untimed_scrapes_are_two_scrapes(scrapes):
    d, text = scrapes
    n_lines = [sum(1 for ln in text[k].splitlines() if ln and not ln.startswith("#")) for k in ("before", "after")]
    parsed = parse_prometheus(d / "both.prom", 0, IngestOptions())
    rows = parsed.tables["metric_samples"].to_pylist()
    assert {r["scrape"] for r in rows} == {0, 1} and all(r["ts_ns"] is None for r in rows)
    assert (
        '"scrapes": 2' in parsed.inputs_rows[0]["meta_json"]
        and '"timed_scrapes": 0' in parsed.inputs_rows[0]["meta_json"]
    )
    assert [sum(r["scrape"] == i for r in rows) for i in (0, 1)] == n_lines  # every sample line, in its scrape
    # the same two scrapes pasted without # HELP/# TYPE lines, or after `$ curl` prompts, are still two
    bare = "\n".join(ln for ln in (text["before"] + text["after"]).splitlines() if not ln.startswith("#"))
    prompts = f"$ curl -s localhost:8000/metrics\n{text['before']}$ curl -s localhost:8000/metrics\n{text['after']}"
    for name, body in (("bare", bare), ("prompts", prompts)):
        f = d / f"{name}.prom"
        f.write_text(body)
        assert '"scrapes": 2' in parse_prometheus(f, 0, IngestOptions()).inputs_rows[0]["meta_json"], name


@pytest.mark.parametrize("layout", ["two files", "one file"])
def test_counters_are_the_runs_difference_between_scrape_1_and_2(scrapes, layout):
    d, text = scrapes
    b, a = _totals(text["before"]), _totals(text["after"])

    def delta(name, pos=""):
        return a[(name, pos)] - b[(name, pos)]

    paths = (d / "before.prom", d / "after.prom") if layout == "two files" else (d / "both.prom",)
    window = (
        "between scrape 1 of before.prom and scrape 1 of after.prom" if layout == "two files"
        else "between scrape 1 and 2 of both.prom"
    )  # fmt: skip
    report = _analyze(*paths)
    # SCH006: the run reused 8 % of its prompt tokens; the lifetime (24 %) would have passed
    c = _check(report, "SCH006")
    reuse = delta("vllm:prefix_cache_hits_total") / delta("vllm:prefix_cache_queries_total")
    lifetime = a[("vllm:prefix_cache_hits_total", "")] / a[("vllm:prefix_cache_queries_total", "")]
    assert lifetime >= 0.10 > reuse
    assert c.status == "finding" and c.values["token_reuse_rate"] == pytest.approx(reuse), c.to_dict()
    assert window in c.title and c.values["window"] == window
    assert c.impact is None and c.values["impact_basis"].startswith("none:")
    # SCH007: E = 1 + Σ P(A1…Ai) of the run's per-position counters
    c = _check(report, "SCH007")
    drafts = delta("vllm:spec_decode_num_drafts_total")
    joint = [delta("vllm:spec_decode_num_accepted_tokens_per_pos_total", str(i)) / drafts for i in range(3)]
    assert c.values["expected_tokens_per_round"] == pytest.approx(1 + sum(joint), abs=1e-4), c.to_dict()
    assert c.values["per_position_joint"] == pytest.approx(joint) and c.values["window"] == window
    assert window in c.title
    # SCH004: the run's preemptions, both scrapes idle: KV usage not measured, not "0.0 %"
    c = _check(report, "SCH004")
    n_pre = delta("vllm:num_preemptions_total")
    assert c.status == "finding" and c.values["preemptions_metric_total"] == n_pre == RUN["preemptions"]
    assert window in c.values["preemptions_metric_window"] and "idle snapshot, not the run's KV usage" in c.title
    assert "0.0 %" not in c.title.split(";")[0] and c.values["kv_usage_max_pct"] == 0.0 and c.values["samples"] == 0
    finished = delta("vllm:request_success_total")
    assert (
        c.impact == pytest.approx(n_pre / finished) and c.impact_basis == "requests (preemptions per finished request)"
    )


def test_one_scrape_is_since_server_start(scrapes):
    d, text = scrapes
    a = _totals(text["after"])
    report = _analyze(d / "after.prom")
    c = _check(report, "SCH006")
    lifetime = a[("vllm:prefix_cache_hits_total", "")] / a[("vllm:prefix_cache_queries_total", "")]
    assert c.status == "pass" and c.values["token_reuse_rate"] == pytest.approx(lifetime)
    assert "since server start: one scrape of after.prom" in c.title
    c = _check(report, "SCH007")
    drafts = a[("vllm:spec_decode_num_drafts_total", "")]
    e = 1 + sum(a[("vllm:spec_decode_num_accepted_tokens_per_pos_total", str(i))] for i in range(3)) / drafts
    assert c.values["expected_tokens_per_round"] == pytest.approx(e, abs=1e-4)
    assert c.values["window"] == "since server start: one scrape of after.prom"


def test_a_counter_reset_breaks_the_difference_and_says_so(scrapes):
    d, text = scrapes
    first, second = (_totals(t) for t in re.split(r"(?=# HELP vllm:num_requests_running )", text["restart"])[1:])
    assert second[("vllm:prefix_cache_queries_total", "")] < first[("vllm:prefix_cache_queries_total", "")]
    report = _analyze(d / "restart.prom")
    for rule in ("SCH006", "SCH007"):
        c = _check(report, rule)
        assert c.status == "not_applicable", c.to_dict()
        assert "counter reset between scrape 1 and 2 of restart.prom" in c.reason and "restarted" in c.reason
    c = _check(report, "SCH004")  # idle scrapes and a preemption counter that cannot be differenced
    assert c.status == "not_applicable" and "idle snapshot" in c.reason and "counter reset" in c.reason


def test_the_same_real_scrape_twice_is_a_window_without_traffic(tmp_path):
    """production-stack #617 pasted twice (before = after): 0 of 32 prefix queries in the window, none at all."""
    src = EXT / "vllm" / "metrics" / "production-stack-617_vllm0.10.0_v1_engine_label_excerpt.prom"
    queries = float(re.search(r"^vllm:prefix_cache_queries_total\{[^}]*\} (\S+)$", src.read_text(), re.M)[1])
    assert queries == 32
    f = tmp_path / "twice.prom"
    f.write_text(src.read_text() + src.read_text())
    c = _check(_analyze(f), "SCH006")
    assert c.status == "not_applicable" and "no prefix-cache query between scrape 1 and 2 of twice.prom" in c.reason


def test_idle_real_scrape_is_not_the_runs_kv_usage():
    """production-stack #318: vllm:num_requests_running 0, num_requests_waiting 0, gpu_cache_usage_perc 0.0."""
    src = EXT / "vllm" / "metrics" / "production-stack-318_v1_early2025_no_engine_label_excerpt.prom"
    text = src.read_text()
    for name in ("num_requests_running", "num_requests_waiting", "gpu_cache_usage_perc"):
        assert float(re.search(rf"^vllm:{name}\{{[^}}]*\}} (\S+)$", text, re.M)[1]) == 0.0
    c = _check(_analyze(src), "SCH004")
    assert c.status == "not_applicable" and "idle snapshot, not the run's KV usage" in c.reason
    assert "under pressure" not in c.reason and "headroom" not in c.reason


def test_busy_real_sglang_scrape_is_the_kv_usage():
    """SGLang docs scrape: 162 running and 2826 queued in the same scrape, so token usage 0.28 is a real sample."""
    src = EXT / "sglang" / "metrics" / "sglang-docs_production_metrics_scrape.prom"
    text = src.read_text()
    usage = float(re.search(r"^sglang:token_usage\{[^}]*\} (\S+)$", text, re.M)[1])
    running = float(re.search(r"^sglang:num_running_reqs\{[^}]*\} (\S+)$", text, re.M)[1])
    queued = float(re.search(r"^sglang:num_queue_reqs\{[^}]*\} (\S+)$", text, re.M)[1])
    assert running > 0 and queued > 0
    c = _check(_analyze(src), "SCH004")
    assert c.status == "pass" and c.values["kv_usage_max_pct"] == pytest.approx(usage * 100)
    assert c.values["idle_snapshots"] is None and "scrape 1" in c.values["kv_usage_max_at"]


def test_sch004_impact_is_a_share_of_request_time_from_the_stats_lines():
    """vLLM #5578 V0: Running/Swapped/Pending and GPU KV usage per stats line: request time waiting at ≥ 95 % KV
    or swapped out over all request time in the engine, counted from the file."""
    src = EXT / "vllm" / "log_excerpts" / "vllm-5578_v0_preemption_warning_swapped_pending.log"
    stats = re.findall(
        r"Running: (\d+) reqs, Swapped: (\d+) reqs, Pending: (\d+) reqs, GPU KV cache usage: ([\d.]+)%", src.read_text()
    )
    assert len(stats) == 2
    lost = sum(int(p) * (float(kv) >= 95) + int(s) for _, s, p, kv in stats)
    total = sum(int(r) + int(s) + int(p) for r, s, p, _ in stats)
    c = _check(analyze([], extra_inputs=[(src, "vllm-log")], extra_rules=RULES), "SCH004")
    assert c.status == "finding" and c.impact == pytest.approx(lost / total)
    assert c.impact_basis.startswith("request time") and c.values["impact"] == pytest.approx(lost / total, abs=1e-4)


SGLANG_LOGS = EXT / "sglang" / "log_excerpts"
DOCS_LOG = SGLANG_LOGS / "sglang-docs_eagle2_torch_compile_server_args_steps5_topk8_draft64.log"


def test_server_args_speculative_fields_are_read_from_the_real_log():
    from tracediag.pipeline import build_store

    text = DOCS_LOG.read_text()
    want = dict(re.findall(r"\b(speculative_(?:algorithm|num_steps|eagle_topk|num_draft_tokens))='?([^,')]+)", text))
    assert want == {"speculative_algorithm": "EAGLE", "speculative_num_steps": "5", "speculative_eagle_topk": "8",
                    "speculative_num_draft_tokens": "64"}  # fmt: skip
    con = build_store([(DOCS_LOG, "sglang-log")])
    try:
        got = dict(con.execute("SELECT key, value FROM serving_startup WHERE key LIKE 'speculative_%'").fetchall())
        model = con.execute("SELECT value FROM serving_startup WHERE key = 'model_path'").fetchone()
    finally:
        con.close()
    assert {k: got[k] for k in want} == want
    assert model == (re.search(r"ServerArgs\(model_path='([^']+)'", text)[1],)


def test_sch007_takes_k_from_server_args_not_from_accept_rate(tmp_path):
    """No public log has both a server_args line and accept len lines: the decode lines of #11948 (EAGLE3, SGLang
    0.5.3) after a server_args line whose speculative fields carry the thread's own launch command
    (`--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1
    --speculative-num-draft-tokens 4`), written into the real server_args line of the docs log (a documented
    transformation of two real files). k and N come from server_args; acceptance is (E − 1) / (N − 1)."""
    args_line = next(ln for ln in DOCS_LOG.read_text().splitlines() if "server_args=ServerArgs(" in ln)
    args_line = (
        args_line.replace("speculative_algorithm='EAGLE'", "speculative_algorithm='EAGLE3'")
        .replace("speculative_num_steps=5", "speculative_num_steps=3")
        .replace("speculative_eagle_topk=8", "speculative_eagle_topk=1")
        .replace("speculative_num_draft_tokens=64", "speculative_num_draft_tokens=4")
    )
    decode = (SGLANG_LOGS / "sglang-11948_eagle3_accept_len_accept_rate.log").read_text()
    f = tmp_path / "eagle3.log"
    f.write_text(args_line + "\n" + decode)
    lens = [float(x) for x in re.findall(r"accept len: ([\d.]+)", decode)]
    e = sum(lens) / len(lens)
    c = _check(analyze([], extra_inputs=[(f, "sglang-log")], extra_rules=RULES), "SCH007")
    assert c.values["k"] == 3 and c.values["k_source"].startswith("server_args speculative_num_steps")
    assert c.values["draft_tokens_verified_per_round"] == 4 and c.values["speculative_algorithm"] == "EAGLE3"
    assert c.values["acceptance_rate"] == pytest.approx((e - 1) / 3, abs=1e-4)
    assert "k = 3 (server_args)" in c.title
    # the same decode lines with a server_args line that says 5 steps: k follows server_args, not accept rate
    f.write_text(args_line.replace("speculative_num_steps=3", "speculative_num_steps=5") + "\n" + decode)
    c = _check(analyze([], extra_inputs=[(f, "sglang-log")], extra_rules=RULES), "SCH007")
    assert c.values["k"] == 5 and "k = 5 (server_args)" in c.title


def test_ttft_split_between_two_untimed_scrapes_is_the_runs(tmp_path):
    """SCH012 on `curl /metrics` before and after a run pasted into one file (no timestamps): the split is of what
    the histograms gained between scrape 1 and 2 — a warm-up without queueing, then a run that waits 0.8 s per
    request — not of the lifetime, which dilutes the queue with the warm-up."""
    from prometheus_client import Histogram

    reg = CollectorRegistry()
    lab = ["model_name", "engine"]
    buckets = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
    ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT.", lab, buckets=buckets, registry=reg)
    queue = Histogram("vllm:request_queue_time_seconds", "Queue.", lab, buckets=buckets, registry=reg)
    prefill = Histogram("vllm:request_prefill_time_seconds", "Prefill.", lab, buckets=buckets, registry=reg)

    def serve(n, q, p, rest=0.01):
        for _ in range(n):
            queue.labels("m", "0").observe(q)
            prefill.labels("m", "0").observe(p)
            ttft.labels("m", "0").observe(q + p + rest)

    serve(300, 0.001, 0.2)  # warm-up: no waiting
    before = generate_latest(reg).decode()
    serve(100, 0.8, 0.2)  # the run: 0.8 s of queueing per request
    after = generate_latest(reg).decode()
    f = tmp_path / "both.prom"
    f.write_text(before + after)
    c = _check(analyze([], extra_inputs=[(f, "prometheus")]), "SCH012")
    assert c.status == "finding" and c.values["window"].startswith("between scrape 1 and 2")
    assert round(c.values["queue_mean_s"], 3) == 0.8 and round(c.values["ttft_mean_s"], 3) == 1.01
    # the lifetime (the last scrape alone) would have said 0.2 s of queueing in 0.41 s
    (tmp_path / "after.prom").write_text(after)
    life = _check(analyze([], extra_inputs=[(tmp_path / "after.prom", "prometheus")]), "SCH012")
    assert (
        life.values["window"].startswith("since the process started")
        and round(life.values["queue_mean_s"], 4) == 0.2008
    )
