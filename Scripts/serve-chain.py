#!/usr/bin/env python3
"""A chain of N `tether serve` nodes on loopback (node i has --peer node i-1), ROWS rows written
on every node at once (in COMMITS commits, by `tether sql`), default limits. Reports the time to
converge and every session failure or link drop the nodes logged before they were stopped, and
the sessions each node had (more than one per link means a reconnect). Outside the test suite:

    swift build && NODES=50 ROWS=1000 COMMITS=10 python3 Scripts/serve-chain.py .build/debug/tether

Environment: NODES (50), ROWS per node (1000), COMMITS per node (10), WORK (a scratch directory,
emptied first), TIMEOUT in seconds (900)."""
import os, re, shutil, sys, threading, time
from fleet import count, serve, run as run_tether

TETHER = sys.argv[1]
N = int(os.environ.get("NODES", "50"))
ROWS = int(os.environ.get("ROWS", "1000"))
COMMITS = int(os.environ.get("COMMITS", "10"))
WORK = os.environ.get("WORK", "/tmp/tether-serve-chain")
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)

def run(*args):
    return run_tether(TETHER, *args)

schema = "CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT, n INTEGER);"
run("cert", "ca", "--out", f"{WORK}/ca")
run("cert", "node", "--ca", f"{WORK}/ca", "--name", "node", "--out", f"{WORK}/cert")
tls = ["--cert", f"{WORK}/cert/cert.pem", "--key", f"{WORK}/cert/key.pem", "--ca", f"{WORK}/ca/ca.pem"]
dbs = [f"{WORK}/n{i}.db" for i in range(N)]
with open(f"{WORK}/schema.sql", "w") as f:
    f.write(schema + "\n")
for db in dbs:
    run("init", "--db", db, "--schema", f"{WORK}/schema.sql", "--sync", "t")

procs, logs, ports = [], [], []
started = time.time()
for i, db in enumerate(dbs):
    peers = ["--peer", f"127.0.0.1:{ports[-1]}"] if ports else []
    p, out, err, port = serve(TETHER, db, tls, peers, f"node {i}", timeout=30)
    ports.append(port)
    procs.append(p)
    logs.append((out, err))
print(f"{N} nodes listening after {time.time() - started:.1f} s", flush=True)

def connected():
    # Both ends of a link log the start of its session (at info).
    return sum(1 for _, err in logs for _, l in err if "sync session started" in l) // 2
deadline = time.time() + 60
while connected() < N - 1 and time.time() < deadline:
    time.sleep(0.1)
print(f"links connected: {connected()} of {N - 1}", flush=True)

def write(i):
    per = ROWS // COMMITS
    for k in range(COMMITS):
        first = i * ROWS + k * per
        run("sql", "--db", dbs[i], f"WITH RECURSIVE s(x) AS (SELECT {first} UNION ALL SELECT x + 1 FROM s WHERE x < {first + per - 1}) "
            f"INSERT INTO t (id, body, n) SELECT x, 'node {i} row ' || x, {i} FROM s")

write_start = time.time()
writers = [threading.Thread(target=write, args=(i,)) for i in range(N)]
for w in writers: w.start()
for w in writers: w.join()
written = time.time()
print(f"written: {N * ROWS} rows in {written - write_start:.1f} s", flush=True)

total = N * ROWS
timeout = float(os.environ.get("TIMEOUT", "900"))
converged = None
while time.time() - write_start < timeout:
    counts = [count(db) for db in dbs]
    if all(c == total for c in counts):
        converged = time.time()
        break
    time.sleep(0.5)
if converged:
    print(f"converged: every node holds {total} rows, {converged - write_start:.1f} s after the writes began "
          f"({converged - written:.1f} s after the last commit)", flush=True)
else:
    print(f"NOT converged after {timeout:.0f} s: counts {counts}", flush=True)

time.sleep(2)
stop_at = time.time() - write_start
for p in procs: p.terminate()
codes = [p.wait(timeout=60) for p in procs]
time.sleep(0.5)
failures = []
for i, (out, err) in enumerate(logs):
    for t, l in err:
        if "session failed" in l or "down (" in l or "ERROR" in l or " error" in l.lower():
            failures.append((t - write_start, i, l))
print(f"exit codes: {sorted(set(codes))}")
before = [f for f in failures if f[0] < stop_at]
print(f"session failures / link drops logged before the stop (at {stop_at:+.1f} s): {len(before)}; during the stop: {len(failures) - len(before)}")
sessions = []
for out, err in logs:
    for _, l in err:
        m = re.search(r"stopped after (\d+) session", l)
        if m: sessions.append(int(m.group(1)))
print(f"sessions per node at the stop: {sorted(set(sessions))} (a chain without reconnects: 1 at the ends, 2 elsewhere)")
for t, i, l in failures[:40]:
    print(f"  {t:+7.1f} s node {i}: {l[:400]}")
with open(f"{WORK}/logs.txt", "w") as f:
    for i, (out, err) in enumerate(logs):
        for t, l in out + err:
            f.write(f"{t - write_start:+.3f} node {i}: {l}\n")
