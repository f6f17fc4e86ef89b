"""History survives the process: one process writes, another reads."""

from __future__ import annotations

from pathlib import Path

from citadeldb_openai_agents import CitadelSession

from conftest import KEY, run_python

WRITER = """
import asyncio, sys
from citadeldb_openai_agents import CitadelSession
async def main():
    s = CitadelSession(sys.argv[2], sys.argv[1], key=sys.argv[3])
    await s.add_items([{"role": "user", "content": "written by process A"}, {"z": 1, "a": 2}])
    s.close()
asyncio.run(main())
"""

READER = """
import asyncio, json, sys
from citadeldb_openai_agents import CitadelSessionStore
async def main():
    with CitadelSessionStore(sys.argv[1], sys.argv[3]) as store:
        print(json.dumps({"ids": store.session_ids(), "items": await store.session(sys.argv[2]).get_items()}))
asyncio.run(main())
"""


def test_a_second_process_reads_what_the_first_wrote(db_path: Path) -> None:
    written = run_python(WRITER, str(db_path), "user-é", KEY)
    assert written.returncode == 0, written.stderr
    read = run_python(READER, str(db_path), "user-é", KEY)
    assert read.returncode == 0, read.stderr
    import json

    result = json.loads(read.stdout)
    assert result["ids"] == ["user-é"]
    assert result["items"] == [{"role": "user", "content": "written by process A"}, {"z": 1, "a": 2}]
    assert list(result["items"][1]) == ["z", "a"]


async def test_reopened_file_keeps_sessions_and_segments(db_path: Path) -> None:
    session = CitadelSession("long", db_path, KEY)
    await session.add_items([{"i": i} for i in range(300)])
    await session.add_items([{"i": i} for i in range(300, 600)])
    session.close()
    again = CitadelSession("long", db_path, KEY)
    try:
        assert [x["i"] for x in await again.get_items(limit=5)] == [595, 596, 597, 598, 599]
        assert await again.pop_item() == {"i": 599}
        await again.add_items([{"i": "new"}])
        assert len(await again.get_items()) == 600
    finally:
        again.close()
