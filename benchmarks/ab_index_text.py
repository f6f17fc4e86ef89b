"""A/B: does indexing each reply under its question make add_items slower? (No: see README.)

    python benchmarks/ab_index_text.py

Fills one session with 10,000 items, then times add_items of one turn with the package's
indexing (question+own) and with each item's own text only, 6 interleaved rounds of 40.
Timing only; nothing is asserted.
"""
import sys, tempfile, time, statistics
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from workload import items, make_turn
from citadeldb_openai_agents import CitadelSessionStore
import citadeldb_openai_agents.layout as L
d = tempfile.mkdtemp()
store = CitadelSessionStore(f"{d}/a.cdl", "k", argon2_profile="iot")
data = items(10000)
for i in range(0, 10000, 100): store._add_items("u", data[i:i+100])
orig = L.SessionLayout.append
def own_only(self, m, st, p, t, u, e): return orig(self, m, st, p, t, [True]*len(u), e)
res = {"question+own": [], "own": []}
for rnd in range(6):
    for name in ("question+own", "own"):
        L.SessionLayout.append = orig if name == "question+own" else own_only
        ts = []
        for n in range(40):
            t = time.perf_counter(); store._add_items("u", make_turn(n)); ts.append(time.perf_counter() - t)
        res[name].append(statistics.median(ts) * 1000)
for k, v in res.items(): print(k, " ".join(f"{x:.2f}" for x in v), "median %.2f" % statistics.median(v))
