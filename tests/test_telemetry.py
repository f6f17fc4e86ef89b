"""What an operator sees (issue 48): spans, metrics and log lines, read back from the OpenTelemetry
SDK's in-memory exporters, and the trace that crosses the owner's socket between real processes.

The SDK's providers are global, set once per process: this module sets them for its worker
(every later test there then runs with telemetry on, which must change nothing they check).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

otel_sdk = pytest.importorskip("opentelemetry.sdk", reason="the otel extra's SDK is in the test extra")

from opentelemetry import metrics, trace  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from citadeldb_openai_agents import (  # noqa: E402
    CitadelSessionError,
    CitadelSessionStore,
    CorruptDatabaseError,
    SessionNotFoundError,
    shard_for,
)

from conftest import KEY  # noqa: E402

_installed: tuple[InMemorySpanExporter, InMemoryMetricReader] | None = None


def installed() -> tuple[InMemorySpanExporter, InMemoryMetricReader]:
    """The SDK, set up once in this process: an in-memory span exporter and metric reader."""
    global _installed
    if _installed is None:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        _installed = (exporter, reader)
    return _installed


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter, _ = installed()
    exporter.clear()
    yield exporter


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return installed()[1]


def measured(reader: InMemoryMetricReader) -> dict[tuple[str, frozenset[tuple[str, Any]]], float]:
    """Every data point now: a counter's sum, a histogram's count, by name and attributes."""
    found: dict[tuple[str, frozenset[tuple[str, Any]]], float] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "count", None) if hasattr(point, "bucket_counts") else point.value
                    found[(metric.name, frozenset(point.attributes.items()))] = float(value or 0)
    return found


def grew(before: dict[Any, float], after: dict[Any, float], name: str, **attributes: Any) -> float:
    """How much a metric grew between two readings, over its points that carry `attributes`."""
    total = 0.0
    for (metric, points), value in after.items():
        if metric == name and all((key.replace("__", "."), v) in points for key, v in attributes.items()):
            total += value - before.get((metric, points), 0.0)
    return total


def items(*texts: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text} for text in texts]


def by_name(exported: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in exported if span.name == name]


# -- spans ------------------------------------------------------------------------------------


def test_each_session_call_and_store_operation_is_a_span_with_the_database_conventions(
    db_path: Path, spans: InMemorySpanExporter
) -> None:
    with CitadelSessionStore(db_path, KEY, argon2_profile="iot") as store:
        session = store.session("alice")
        asyncio.run(session.add_items(items("one", "two", "three")))
        assert len(asyncio.run(session.get_items(limit=2))) == 2
        asyncio.run(session.search("two"))
        asyncio.run(session.pop_item())
        store.erase_session("alice")
        with pytest.raises(SessionNotFoundError):
            store.erase_session("nobody here")
    exported = spans.get_finished_spans()
    public = {"add_items": 3, "get_items": 2, "search": 0, "pop_item": 1, "erase_session": None}
    for name, counted in public.items():
        span = by_name(exported, name)[0]
        assert span.kind is trace.SpanKind.CLIENT
        assert span.attributes is not None
        assert span.attributes["db.system.name"] == "citadeldb"
        assert span.attributes["db.operation.name"] == name
        assert span.attributes["db.namespace"] == str(db_path.resolve())
        assert span.attributes["citadel.role"] == "owner"
        if counted is not None and name != "search":
            assert span.attributes["citadel.items"] == counted, name
    # Each public call's operations are its children, where the file is (here: this process).
    add, append = by_name(exported, "add_items")[0], by_name(exported, "append")[0]
    assert append.parent is not None and append.parent.span_id == add.context.span_id
    assert append.attributes is not None and append.attributes["citadel.items.written"] == 3
    assert append.attributes["citadel.bytes.written"] > 0 and append.attributes["citadel.role"] == "owner"
    newest = by_name(exported, "newest")[0]
    assert newest.attributes is not None and newest.attributes["citadel.items.read"] == 2
    # The failure: its type, no message (it names the session).
    failed = by_name(exported, "erase_session")[1]
    assert failed.attributes is not None and failed.attributes["error.type"] == "SessionNotFoundError"
    assert failed.status.status_code is trace.StatusCode.ERROR and not failed.status.description
    assert not failed.events


PLANTED_SESSION = "planted-session-id-3f9a"
PLANTED_OWNER = "planted-owner-77b1@example.com"
PLANTED_TEXT = "planted item text 5c2e"
PLANTED_KEY = "planted passphrase 0d4f never shown"


def test_no_span_metric_or_log_line_holds_item_text_a_session_id_an_owner_or_the_passphrase(
    db_path: Path, spans: InMemorySpanExporter, reader: InMemoryMetricReader, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="citadeldb_openai_agents")
    with CitadelSessionStore(db_path, PLANTED_KEY, argon2_profile="iot", idle_ttl=600) as store:
        session = store.session(PLANTED_SESSION, owner=PLANTED_OWNER)
        asyncio.run(session.add_items(items(PLANTED_TEXT, f"{PLANTED_TEXT} again")))
        asyncio.run(session.get_items())
        asyncio.run(session.search(PLANTED_TEXT))
        asyncio.run(session.pop_item())
        store.export(PLANTED_SESSION)
        store.sessions(owner=PLANTED_OWNER)
        store.search(PLANTED_TEXT, owner=PLANTED_OWNER)
        with pytest.raises(SessionNotFoundError):
            store.erase_session(f"{PLANTED_SESSION}-missing")
        store.erase_owner(PLANTED_OWNER)
        store.purge()
    exported = spans.get_finished_spans()
    assert len(exported) > 15
    shown = [span.to_json() for span in exported]  # name, attributes, events, status, resource
    shown += [json.dumps(sorted(map(str, key))) for key in measured(reader)]
    shown += [record.getMessage() + json.dumps(vars(record), default=str) for record in caplog.records]
    assert any("receipt" in line for line in shown), "the erasure left no line to search"
    for planted in (PLANTED_SESSION, PLANTED_OWNER, PLANTED_TEXT, PLANTED_KEY, "planted"):
        leaks = [line for line in shown if planted in line]
        assert not leaks, (planted, leaks[:2])


# -- metrics ------------------------------------------------------------------------------------


def test_the_metrics_count_calls_items_erasures_and_searches_once(
    db_path: Path, reader: InMemoryMetricReader, spans: InMemorySpanExporter
) -> None:
    before = measured(reader)
    with CitadelSessionStore(db_path, KEY, argon2_profile="iot") as store:
        session = store.session("alice")
        asyncio.run(session.add_items(items("one", "two")))
        asyncio.run(session.add_items(items("three")))
        asyncio.run(session.get_items())
        asyncio.run(session.search("two"))
        asyncio.run(session.pop_item())
        store.erase_session("alice")
        capped = store.session("capped", max_items=2)
        asyncio.run(capped.add_items(items("a", "b", "c")))  # the oldest is erased at once
        asyncio.run(capped.clear_session())
    after = measured(reader)
    path = str(db_path.resolve())
    assert grew(before, after, "citadel.items.erased", citadel__erasure__cause="max_items") == 1
    assert grew(before, after, "citadel.items.erased", citadel__erasure__cause="clear") == 2
    assert grew(before, after, "db.client.operation.duration", db__operation__name="add_items") == 3
    assert grew(before, after, "db.client.operation.duration", db__operation__name="get_items") == 1
    assert grew(before, after, "citadel.items.written", db__namespace=path) == 6
    assert grew(before, after, "citadel.items.read", db__namespace=path) >= 3  # get_items, search
    assert grew(before, after, "citadel.items.erased", citadel__erasure__cause="pop") == 1
    assert grew(before, after, "citadel.items.erased", citadel__erasure__cause="erase") == 2
    assert grew(before, after, "citadel.erasures", citadel__readback="confirmed") == 1
    assert grew(before, after, "citadel.search.duration", db__namespace=path) == 1


# -- the trace across the socket, between real processes ------------------------------------------

# An owner that serves the file, its spans written to a file as JSON lines (argv[3] "otel"), or
# without OpenTelemetry at all (argv[3] "none": as if the extra were not installed).
OWNER = textwrap.dedent(
    """
    import json, sys
    path, key, mode, out = sys.argv[1:5]
    if mode == "otel":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

        class ToFile(SpanExporter):
            def export(self, spans):
                with open(out, "a") as handle:
                    for s in spans:
                        handle.write(json.dumps({
                            "name": s.name, "trace": s.context.trace_id, "span": s.context.span_id,
                            "parent": s.parent.span_id if s.parent else None, "kind": s.kind.name,
                            "attributes": dict(s.attributes)}) + "\\n")
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(ToFile()))
        trace.set_tracer_provider(provider)
    else:
        sys.modules["opentelemetry"] = None  # not installed, as far as this process can tell
    from citadeldb_openai_agents import CitadelSessionStore
    store = CitadelSessionStore(path, key, argon2_profile="iot")
    print("ready", flush=True)
    sys.stdin.read()
    print(sorted(name for name, module in sys.modules.items() if module and name.startswith("opentelemetry")), flush=True)
    """
)


def _owner(db_path: Path, mode: str, out: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CITADEL_")}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(db_path), KEY, mode, str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert owner.stdout is not None and owner.stdout.readline().strip() == "ready"
    return owner


def _stopped(owner: subprocess.Popen[str]) -> str:
    # 0.46 s at most under load (benchmarks/suite_under_load.py, 2026-12-08)
    out, _ = owner.communicate("", timeout=60)
    return out


def test_a_served_call_continues_the_clients_trace_in_the_owner(
    db_path: Path, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    out = tmp_path / "owner-spans.jsonl"
    owner = _owner(db_path, "otel", out)
    try:
        with CitadelSessionStore(db_path, KEY) as client:
            assert client.served_by == owner.pid
            session = client.session("alice")
            asyncio.run(session.add_items(items("served")))
            assert asyncio.run(session.get_items()) == items("served")
    finally:
        _stopped(owner)
    mine = {span.name: span for span in spans.get_finished_spans()}
    theirs = [json.loads(line) for line in out.read_text().splitlines()]
    for public, operation in (("add_items", "append"), ("get_items", "all_items")):
        span = mine[public]
        assert span.attributes is not None and span.attributes["citadel.role"] == "client"
        served = [s for s in theirs if s["name"] == operation]
        assert len(served) == 1, theirs
        assert served[0]["trace"] == span.context.trace_id  # one trace, two processes
        assert served[0]["parent"] == span.context.span_id  # the owner's span is the client's child
        assert served[0]["kind"] == "SERVER" and served[0]["attributes"]["citadel.role"] == "owner"


def test_an_owner_without_the_extra_serves_a_client_with_it_and_the_trace_ends_at_the_socket(
    db_path: Path, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    owner = _owner(db_path, "none", tmp_path / "unused.jsonl")
    try:
        with CitadelSessionStore(db_path, KEY) as client:
            session = client.session("alice")
            asyncio.run(session.add_items(items("to an owner without OpenTelemetry")))
            assert len(asyncio.run(session.get_items())) == 1
    finally:
        imported = _stopped(owner)
    assert imported.strip() == "[]", "the owner without the extra imported some of OpenTelemetry"
    add = by_name(spans.get_finished_spans(), "add_items")[0]
    assert add.attributes is not None and add.attributes["citadel.role"] == "client"
    assert not by_name(spans.get_finished_spans(), "append"), "no owner span here: it is the owner's"


CLIENT_WITHOUT_EXTRA = textwrap.dedent(
    """
    import asyncio, sys
    sys.modules["opentelemetry"] = None
    from citadeldb_openai_agents import CitadelSessionStore
    with CitadelSessionStore(sys.argv[1], sys.argv[2]) as store:
        session = store.session("bob")
        asyncio.run(session.add_items([{"role": "user", "content": "from a client without it"}]))
        print(store.served_by is not None, len(asyncio.run(session.get_items())), flush=True)
    print(sorted(name for name, module in sys.modules.items() if module and name.startswith("opentelemetry")))
    """
)


def test_a_client_without_the_extra_works_with_an_owner_with_it_whose_span_then_starts_the_trace(
    db_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "owner-spans.jsonl"
    owner = _owner(db_path, "otel", out)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CITADEL_")}
        done = subprocess.run(
            [sys.executable, "-c", CLIENT_WITHOUT_EXTRA, str(db_path), KEY],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,  # the whole test took 6.2 s under load (benchmarks/suite_under_load.py)
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == ["True 1", "[]"]
    finally:
        _stopped(owner)
    served = [json.loads(line) for line in out.read_text().splitlines()]
    append = [span for span in served if span["name"] == "append"]
    assert len(append) == 1 and append[0]["parent"] is None  # nothing to continue: a trace of its own


# -- log lines and retention's receipts ---------------------------------------------------------


def test_retention_leaves_a_receipt_in_the_log_the_metrics_the_ledger_and_the_next_purge(
    db_path: Path, tmp_path: Path, reader: InMemoryMetricReader, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 48's case: idle_ttl=2, a session left idle is erased by the owner's sweep before
    `purge` runs; purge then reports it, and the log, the metrics and the ledger have its receipt."""
    caplog.set_level(logging.INFO, logger="citadeldb_openai_agents")
    ledger = tmp_path / "erasures.ledger"
    before = measured(reader)
    with CitadelSessionStore(db_path, KEY, argon2_profile="iot", idle_ttl=2, erasure_ledger=ledger) as store:
        asyncio.run(store.session("left-idle-7").add_items(items("said once")))
        asyncio.run(store.session("busy").add_items(items("said")))
        # Until the sweep (every 0.5 s) has erased the idle session and kept its receipt for the
        # next purge (the receipt's last step, after its log line), the busy one is written to:
        # 0.12 s at most between two of its writes under load, 2 s without one would end it.
        # The sweep's erasure was logged 2.7 s at most after the idle session's write under load;
        # a minute is far above that. (benchmarks/suite_under_load.py --runs 1 --command --
        # python -m pytest -q -s tests/test_telemetry.py -k receipt_in_the_log, 2026-12-08)
        kept_for_purge = store._file._local._layout.recent
        deadline = time.monotonic() + 60
        while kept_for_purge.waiting == 0:
            assert time.monotonic() < deadline, "the owner's sweep erased nothing in a minute"
            asyncio.run(store.session("busy").add_items(items("again")))
            time.sleep(0.05)
        swept = [r for r in caplog.records if getattr(r, "citadel_cause", None) == "retention"]
        assert [(r.citadel_rule, r.citadel_trigger) for r in swept] == [("idle_ttl", "sweep")], [
            r.getMessage() for r in caplog.records
        ]
        assert "it ended by idle_ttl, found by the sweep" in swept[0].getMessage()
        receipt = swept[0].citadel_receipt
        report = store.purge()
    assert report.ended == [] and report.expired_items == 0
    assert [(s.session_id, s.rule, s.erasure.receipt_id) for s in report.swept] == [
        ("left-idle-7", "idle_ttl", receipt)
    ]
    assert report.swept[0].erasure.readback_confirmed
    erasure_lines = [r for r in caplog.records if getattr(r, "citadel_receipt", None) == receipt]
    assert [r.citadel_event for r in erasure_lines] == ["erasure"]  # one line for the one event
    assert all(
        "left-idle-7" not in r.getMessage() and len(r.citadel_session_hash) == 32 for r in erasure_lines
    )
    after = measured(reader)
    assert grew(before, after, "citadel.retention.erasures", citadel__retention__trigger="sweep") == 1
    assert grew(before, after, "citadel.erasures", citadel__erasure__cause="retention") == 1
    entries = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert len(entries) == 1  # the idle session's erasure, recorded before its keys were destroyed


def test_a_takeover_logs_one_line_and_counts_one_handover(
    db_path: Path, tmp_path: Path, reader: InMemoryMetricReader, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="citadeldb_openai_agents")
    owner = _owner(db_path, "none", tmp_path / "unused.jsonl")
    before = measured(reader)
    with CitadelSessionStore(db_path, KEY) as client:
        session = client.session("alice")
        asyncio.run(session.add_items(items("before the owner goes")))
        owner.kill()
        # 0.034 s at most under load (benchmarks/suite_under_load.py, 2026-12-08)
        owner.wait(timeout=30)
        asyncio.run(session.add_items(items("after")))  # this process takes the file over
        assert client.served_by is None
    lines = [r for r in caplog.records if getattr(r, "citadel_event", None) == "handover"]
    assert len(lines) == 1 and lines[0].citadel_previous_owner == owner.pid
    assert f"from process {owner.pid}" in lines[0].getMessage()
    assert grew(before, measured(reader), "citadel.handovers") == 1


def test_a_damaged_file_refused_at_open_is_logged_and_counted(
    tmp_path: Path, reader: InMemoryMetricReader, caplog: pytest.LogCaptureFixture
) -> None:
    import test_damage
    from test_damage import Citadel, damage_atom

    caplog.set_level(logging.INFO, logger="citadeldb_openai_agents")
    path, _ = test_damage.original.__wrapped__(tmp_path)
    damage_atom(path, Citadel(path).segments_of("alice"), 7, "item")
    before = measured(reader)
    with pytest.raises(CorruptDatabaseError):
        CitadelSessionStore(path, test_damage.KEY)
    lines = [r for r in caplog.records if getattr(r, "citadel_event", None) == "damage"]
    assert len(lines) == 1 and lines[0].citadel_path == str(path.resolve())
    assert grew(before, measured(reader), "citadel.opens.refused", citadel__refusal__cause="damage") == 1


# -- without the extra ------------------------------------------------------------------------

WITHOUT = textwrap.dedent(
    """
    import asyncio, sys
    sys.modules["opentelemetry"] = None
    from citadeldb_openai_agents import CitadelSessionStore
    with CitadelSessionStore(sys.argv[1], sys.argv[2], argon2_profile="iot") as store:
        asyncio.run(store.session("a").add_items([{"role": "user", "content": "x"}]))
        store.erase_session("a")
    print(sorted(name for name, module in sys.modules.items() if module and name.startswith("opentelemetry")))
    """
)


def test_without_the_extra_nothing_of_opentelemetry_is_imported(db_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CITADEL_")}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT, str(db_path), KEY],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,  # the whole test took 3.1 s under load (benchmarks/suite_under_load.py)
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_trace_example_shows_one_served_turn_as_one_trace_over_both_processes() -> None:
    """examples/telemetry/trace_turn.py, whose output docs/operations.md shows."""
    example = Path(__file__).resolve().parent.parent / "examples" / "telemetry" / "trace_turn.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CITADEL_")}
    # The whole test took 17.5 s under load (benchmarks/suite_under_load.py, 2026-12-08): over 10x that.
    done = subprocess.run(
        [sys.executable, str(example)], capture_output=True, text=True, env=env, timeout=240
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "one trace: 1 trace id, 7 spans" in lines
    tree = [line for line in lines if "[client]" in line or "[owner]" in line]
    shape = [(len(line) - len(line.lstrip()), line.split()[0], line.split()[1]) for line in tree]
    assert shape == [
        (0, "POST", "/turn"),
        (2, "get_items", "[client]"),
        (4, "all_items", "[owner]"),
        (2, "add_items", "[client]"),
        (4, "append", "[owner]"),
        (2, "add_items", "[client]"),
        (4, "append", "[owner]"),
    ]


def test_a_refused_handshake_is_counted_by_its_cause_in_the_owner(
    db_path: Path, reader: InMemoryMetricReader
) -> None:
    import socket as sockets

    from citadeldb_openai_agents.serving.address import socket_path

    before = measured(reader)
    with CitadelSessionStore(db_path, KEY, argon2_profile="iot") as store:
        assert store.served_by is None  # this process owns and serves the file
        with sockets.socket(sockets.AF_UNIX) as peer:
            peer.connect(socket_path(str(db_path.resolve())))
            peer.sendall(b"\xff" * 64)  # not a client of this package
            peer.settimeout(10)
            with contextlib.suppress(ConnectionResetError):
                assert peer.recv(64) == b""  # dropped
        # Counted 0.024 s at most after the handshake was refused under load (benchmarks/
        # suite_under_load.py --runs 1 --command -- python -m pytest -q -s tests/test_telemetry.py
        # -k refused_handshake, 2026-12-08): 10 s is far above that.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            counted = grew(
                before, measured(reader), "citadel.handshake.refusals", citadel__refusal__cause="protocol"
            )
            if counted:
                break
            time.sleep(0.05)
    assert counted == 1


def test_a_ring_change_read_from_the_ring_file_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="citadeldb_openai_agents")
    ring = tmp_path / "ring.toml"
    ring.write_text('shards = ["a", "b"]\n')
    with CitadelSessionStore(
        tmp_path / "agent.cdl", KEY, argon2_profile="iot", ring_file=ring, shard="a"
    ) as store:
        mine = next(f"user-{n}" for n in range(100) if shard_for(f"user-{n}", ["a", "b"]) == "a")
        asyncio.run(store.session(mine).get_items())
        ring.with_suffix(".new").write_text('shards = ["a", "b", "c"]\nprevious = ["a", "b"]\n')
        os.replace(ring.with_suffix(".new"), ring)
        for _ in range(3):
            with contextlib.suppress(CitadelSessionError):  # it may be moving now: refused, still read
                asyncio.run(store.session(mine).get_items())
    lines = [r for r in caplog.records if getattr(r, "citadel_event", None) == "ring_change"]
    assert len(lines) == 1
    assert lines[0].citadel_shards == ["a", "b", "c"] and lines[0].citadel_previous_shards == ["a", "b"]
