"""Write Citadel files with the original package, citadeldb-openai-agents 2.7.0, and a manifest.

    python tests/legacy_files/make.py              # rewrite the committed files and manifest
    python tests/legacy_files/make.py --check      # write them anew elsewhere; compare manifests

benchmarks/import_speed.py --original calls `generate_sized` for a larger file of the same kind.

The original package has this project's distribution name, so it runs from a virtual
environment of its own (the one benchmarks/sessions.py builds, with citadeldb 2.7.* pinned
too): this script, run by our interpreter, re-runs itself there with ``--write DIR``.

The files (passphrase `KEY`; `MockEmbedder`, as the original's README allows):

* ``default.cdl``: region ``sessions`` (the original's default). Sessions without TTL and
  with a long one; one item and one whole session expired; popped and cleared items; a
  1,000-item session; non-ASCII ids; function calls, tool outputs, multi-part content.
* ``custom.cdl``: two regions of the user's naming, ``support`` and ``billing`` (another
  embedder width), so an import must be told which.

manifest.json records, per file and region, each session's items exactly as the original
package returns them (`store.items(sid)`: its payloads come back with their keys sorted),
each item's expiry and the region's embedding width. `--check`
compares two manifests with the expiry times reduced to whether there is one: they differ
from run to run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
KEY = "legacy passphrase 2.x"
YEARS = 20 * 365 * 24 * 3600.0  # a TTL that outlives the tests reading the files
REQUIREMENTS = ["citadeldb-openai-agents==2.7.0", "citadeldb==2.7.*"]
FILES = ("default.cdl", "custom.cdl")


def conversation(tag: str, turns: int) -> list[dict[str, Any]]:
    """What an agent's session holds: questions, reasoning, tool calls and outputs, replies."""
    items: list[dict[str, Any]] = []
    for n in range(turns):
        call = f"call_{tag}_{n}"
        items += [
            {"role": "user", "content": f"{tag} question {n}: what is the weather in Lisboa?"},
            {
                "type": "reasoning",
                "id": f"rs_{tag}_{n}",
                "summary": [{"type": "summary_text", "text": "look it up"}],
            },
            {
                "type": "function_call",
                "call_id": call,
                "name": "get_weather",
                "arguments": json.dumps({"city": "Lisboa", "n": n}),
                "id": f"fc_{tag}_{n}",
                "status": "completed",
            },
            {"type": "function_call_output", "call_id": call, "output": f"sunny, {20 + n % 10} °C"},
            {
                "type": "message",
                "role": "assistant",
                "id": f"msg_{tag}_{n}",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": f"It is sunny ({tag}, turn {n}).", "annotations": []},
                    {"type": "output_text", "text": "Anything else?", "annotations": []},
                ],
            },
        ]
    return items


async def write_default(path: str, embedder: Any) -> None:
    from citadeldb_openai_agents import CitadelSession, CitadelSessionStore

    forever = CitadelSessionStore(path, KEY, embedder=embedder)
    long = CitadelSessionStore(path, KEY, embedder=embedder, ttl=YEARS)
    brief = CitadelSessionStore(path, KEY, embedder=embedder, ttl=1.0)

    await forever.session("plain").add_items(conversation("plain", 3))
    big = forever.session("big")
    for start in range(0, 1000, 100):  # 1,000 items in ten turns' writes
        await big.add_items(conversation(f"big{start}", 20))
    await long.session("ttl-long").add_items(conversation("long", 2))
    mixed = "ttl-mixed"
    await forever.session(mixed).add_items(conversation("m0", 1))
    await long.session(mixed).add_items(conversation("m1", 1))
    await brief.session(mixed).add_items([{"role": "user", "content": "this one expires"}])
    await long.session(mixed).add_items([{"role": "user", "content": "after the expired one"}])
    await brief.session("all-expired").add_items(conversation("gone", 1))
    popped = forever.session("popped")
    await popped.add_items(conversation("popped", 2))
    await popped.pop_item()
    await popped.pop_item()
    await forever.session("cleared").add_items(conversation("cleared", 1))
    await forever.session("cleared").clear_session()
    reused = forever.session("cleared-then-reused")
    await reused.add_items(conversation("before", 1))
    await reused.clear_session()
    await reused.add_items([{"role": "user", "content": "after the clear"}])
    # The README's own form: a session that opens the file itself.
    for sid in ("usuário-ção", "用户-42", "emoji-🦉", "Bob", "bob"):
        session = CitadelSession(sid, path, key=KEY, embedder=embedder)
        await session.add_items(conversation(sid, 1))
    time.sleep(1.5)  # the 1-second items have expired
    for store in (forever, long, brief):
        store.close()


async def write_custom(path: str, embedders: dict[str, Any]) -> None:
    from citadeldb_openai_agents import CitadelSessionStore

    for region, embedder in embedders.items():
        store = CitadelSessionStore(path, KEY, embedder=embedder, region=region)
        for n in range(3):
            await store.session(f"{region}-{n}").add_items(conversation(f"{region}{n}", n + 1))
        store.close()


async def write_sized(path: str, sessions: int, items: int) -> None:
    """`sessions` sessions of `items` items each, region ``sessions``, MockEmbedder(32), no TTL."""
    import citadeldb

    from citadeldb_openai_agents import CitadelSessionStore

    store = CitadelSessionStore(path, KEY, embedder=citadeldb.MockEmbedder(dim=32))
    for n in range(sessions):
        session = store.session(f"user-{n}")
        for start in range(0, items, 500):  # turns of 100 conversations' worth, as an agent writes
            await session.add_items(conversation(f"s{n}t{start}", min(500, items - start) // 5))
    store.close()


def manifest_of(directory: Path) -> dict[str, Any]:
    """What each file holds, read back by the original package and by Citadel's maintenance handle."""
    import gc

    import citadeldb

    from citadeldb_openai_agents import CitadelSessionStore

    out: dict[str, Any] = {}
    for name in FILES:
        path = str(directory / name)
        db = citadeldb.connect(path, key=KEY, region_keys=True)
        maintenance = db.memory_maintenance()
        regions = {entry.region.name: entry for entry in maintenance.inventory()}
        file: dict[str, Any] = {}
        for region, entry in sorted(regions.items()):
            store = CitadelSessionStore(
                path, KEY, embedder=citadeldb.MockEmbedder(dim=entry.region.dim), region=region
            )
            sessions = {}
            for sid in store.session_ids():
                hits = store.items(sid)
                sessions[sid] = {
                    "items": [hit.payload["item"] for hit in hits],
                    "expires_at": [hit.expires_at for hit in hits],
                }
            file[region] = {"dim": entry.region.dim, "sessions": sessions}
            store.close()
        out[name] = {"key": KEY, "regions": file}
        db.close()
        del db, maintenance
        gc.collect()
    return out


def write(directory: Path) -> None:
    """Run inside the original package's environment: the files, then the manifest."""
    import asyncio

    import citadeldb

    directory.mkdir(parents=True, exist_ok=True)
    asyncio.run(write_default(str(directory / "default.cdl"), citadeldb.MockEmbedder(dim=32)))
    asyncio.run(
        write_custom(
            str(directory / "custom.cdl"),
            {"support": citadeldb.MockEmbedder(dim=48), "billing": citadeldb.MockEmbedder(dim=16)},
        )
    )
    manifest = manifest_of(directory)
    (directory / "manifest.json").write_text(
        json.dumps(manifest, indent=1, ensure_ascii=False, sort_keys=True) + "\n"
    )


def comparable(manifest: dict[str, Any]) -> dict[str, Any]:
    """A manifest with each expiry reduced to whether there is one (times differ per run)."""
    copy = json.loads(json.dumps(manifest))
    for file in copy.values():
        for region in file["regions"].values():
            for session in region["sessions"].values():
                session["expires_at"] = [at is not None for at in session["expires_at"]]
    return copy


def original_python() -> Path:
    """The interpreter of a virtual environment holding the original package (built once)."""
    sys.path.insert(0, str(HERE.parent.parent / "benchmarks"))
    from sessions import default_peer_venv

    venv = default_peer_venv()
    python = venv / "bin" / "python"
    probe = (
        "import importlib.metadata as m; print(m.version('citadeldb-openai-agents'), m.version('citadeldb'))"
    )
    # A fresh machine has no such environment yet: it is built here, as CI's slow tier needs it.
    found = (
        subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=False, cwd="/")
        if python.exists()
        else None
    )
    if found is None or found.returncode != 0 or not found.stdout.startswith("2.7.0 2.7."):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *REQUIREMENTS], check=True, timeout=900)
    return python


def generate(directory: Path) -> None:
    """Write the files into `directory` with the original package, from its own environment."""
    python = original_python()
    # cwd elsewhere: this project's checkout must not shadow the installed original package
    subprocess.run(
        [str(python), str(Path(__file__).resolve()), "--write", str(directory)], check=True, cwd="/"
    )


def generate_sized(path: Path, sessions: int, items: int) -> None:
    """Write `write_sized`'s file at `path` with the original package (items: a multiple of 5)."""
    python = original_python()
    script = str(Path(__file__).resolve())
    subprocess.run(
        [str(python), script, "--write-sized", str(path), str(sessions), str(items)], check=True, cwd="/"
    )


def main(argv: list[str]) -> int:
    if argv[:1] == ["--write-sized"]:
        import asyncio

        asyncio.run(write_sized(argv[1], int(argv[2]), int(argv[3])))
        return 0
    if argv[:1] == ["--write"]:
        write(Path(argv[1]))
        return 0
    if argv[:1] == ["--check"]:
        with tempfile.TemporaryDirectory() as scratch:
            generate(Path(scratch))
            fresh = json.loads((Path(scratch) / "manifest.json").read_text())
        committed = json.loads((HERE / "manifest.json").read_text())
        if comparable(fresh) != comparable(committed):
            print("the original package now writes other files than the committed ones:", file=sys.stderr)
            print(json.dumps(comparable(fresh), ensure_ascii=False)[:2000], file=sys.stderr)
            return 1
        print("the original package writes what the committed manifest records")
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        generate(Path(scratch))
        for name in os.listdir(scratch):
            shutil.copy2(Path(scratch) / name, HERE / name)
    print(f"wrote {', '.join(FILES)} and manifest.json into {HERE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
