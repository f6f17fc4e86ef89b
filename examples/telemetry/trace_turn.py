"""One agent turn served by another process, as OpenTelemetry records it: the trace tree.

    python examples/telemetry/trace_turn.py

Two processes on one file: an owner, started here, and this process, its client, which runs
one `Runner.run` turn (a `ScriptedModel`: no API key, no network) against a `CitadelSession`.
Each process has the OpenTelemetry SDK with an exporter of its own (the owner writes its spans
to a file); the trace context crosses the owner's socket with each call, so the owner's spans
are children of this process's. Prints the tree, each span with its process, duration and the
attributes an operator reads. Needs ``pip install opentelemetry-sdk`` (the ``test`` extra has it).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from agents import Agent, Runner, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from citadeldb_openai_agents import CitadelSessionStore

PASSPHRASE = "trace example passphrase, not a secret"
SHOWN = (
    "citadel.role",
    "citadel.items",
    "citadel.items.written",
    "citadel.items.read",
    "citadel.bytes.written",
)

OWNER = textwrap.dedent(
    """
    import json, sys
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class ToFile(SpanExporter):
        def export(self, spans):
            with open(sys.argv[3], "a") as out:
                for s in spans:
                    out.write(json.dumps({"process": "owner", "name": s.name, "span": s.context.span_id,
                        "parent": s.parent.span_id if s.parent else None, "trace": s.context.trace_id,
                        "start": s.start_time, "end": s.end_time, "attributes": dict(s.attributes)}) + "\\n")
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ToFile()))
    trace.set_tracer_provider(provider)
    from citadeldb_openai_agents import CitadelSessionStore
    store = CitadelSessionStore(sys.argv[1], sys.argv[2], argon2_profile="iot")
    print("ready", flush=True)
    sys.stdin.read()
    """
)


def main() -> None:
    set_tracing_disabled(True)  # the Agents SDK's own traces go to OpenAI: off, offline
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    with tempfile.TemporaryDirectory() as scratch:
        path, owner_spans = Path(scratch) / "agent.cdl", Path(scratch) / "owner.jsonl"
        owner = subprocess.Popen(
            [sys.executable, "-c", OWNER, str(path), PASSPHRASE, str(owner_spans)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert owner.stdout is not None and owner.stdout.readline().strip() == "ready"
            with CitadelSessionStore(path, PASSPHRASE) as store:
                session = store.session("user-123")
                agent = Agent(name="assistant", model=ScriptedModel([[assistant_message("Noted.")]]))
                with trace.get_tracer("example").start_as_current_span("POST /turn"):
                    asyncio.run(Runner.run(agent, "Remember: my dog is called Mochi.", session=session))
                print(f"this process (PID {os.getpid()}) is a client of the owner, PID {store.served_by}")
        finally:
            owner.communicate("", timeout=60)
        spans = [_mine(span) for span in exporter.get_finished_spans()]
        spans += [json.loads(line) for line in owner_spans.read_text().splitlines()]
    print(f"one trace: {len({span['trace'] for span in spans})} trace id, {len(spans)} spans\n")
    _print_tree(spans)


def _mine(span: Any) -> dict[str, Any]:
    return {
        "process": "client",
        "name": span.name,
        "span": span.context.span_id,
        "parent": span.parent.span_id if span.parent else None,
        "trace": span.context.trace_id,
        "start": span.start_time,
        "end": span.end_time,
        "attributes": dict(span.attributes or {}),
    }


def _print_tree(spans: list[dict[str, Any]]) -> None:
    children: dict[Any, list[dict[str, Any]]] = {}
    for span in spans:
        children.setdefault(span["parent"], []).append(span)

    def show(span: dict[str, Any], depth: int) -> None:
        took = (span["end"] - span["start"]) / 1e6
        shown = ", ".join(f"{k}={span['attributes'][k]}" for k in SHOWN if k in span["attributes"])
        print(f"{'  ' * depth}{span['name']:<{28 - 2 * depth}} [{span['process']}] {took:7.2f} ms  {shown}")
        for child in sorted(children.get(span["span"], []), key=lambda s: s["start"]):
            show(child, depth + 1)

    for root in sorted(children.get(None, []), key=lambda s: s["start"]):
        show(root, 0)


if __name__ == "__main__":
    main()
