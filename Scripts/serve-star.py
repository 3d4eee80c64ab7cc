#!/usr/bin/env python3
"""A hub and N `tether serve` nodes on loopback, each node with one link to the hub (--peer),
the way issue 24's idle-cost and convergence figures were taken. Measures, outside the test suite:

  1. idle: the CPU all the processes used over IDLE seconds once every link is up and nothing is
     written (from /proc/PID/stat, in % of one core, the hub apart), and the load average;
  2. convergence: ROWS rows written on every node at once (one `tether sql` each), then the time
     until every node holds all N * ROWS rows (each node's rows reach the others through the hub).

    swift build -c release --product tether
    sysctl -w fs.inotify.max_user_instances=1024   # one inotify instance per process; 128 by default
    NODES=400 ROWS=100 python3 Scripts/serve-star.py .build/release/tether

Environment: NODES (100), ROWS per node (100), IDLE seconds (10), WORK (a scratch directory,
emptied first), TIMEOUT in seconds (900)."""
import os, shutil, sys, threading, time
from fleet import count, serve, run as run_tether

TETHER = sys.argv[1]
N = int(os.environ.get("NODES", "100"))
ROWS = int(os.environ.get("ROWS", "100"))
IDLE = float(os.environ.get("IDLE", "10"))
WORK = os.environ.get("WORK", "/tmp/tether-serve-star")
TIMEOUT = float(os.environ.get("TIMEOUT", "900"))
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
TICKS = os.sysconf("SC_CLK_TCK")


def run(*args):
    return run_tether(TETHER, *args)


def cpu_seconds(pid):
    """User plus system CPU time of a process so far (10 ms ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


run("cert", "ca", "--out", f"{WORK}/ca")
run("cert", "node", "--ca", f"{WORK}/ca", "--name", "node", "--out", f"{WORK}/cert")
tls = ["--cert", f"{WORK}/cert/cert.pem", "--key", f"{WORK}/cert/key.pem", "--ca", f"{WORK}/ca/ca.pem"]
with open(f"{WORK}/schema.sql", "w") as f:
    f.write("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT, n INTEGER);\n")
dbs = [f"{WORK}/n{i}.db" for i in range(N + 1)]  # dbs[0] is the hub's
init_start = time.time()
for db in dbs:
    run("init", "--db", db, "--schema", f"{WORK}/schema.sql", "--sync", "t")
print(f"{N + 1} databases made in {time.time() - init_start:.1f} s", flush=True)

procs, errs = [], []


def start(db, peers):
    p, _, err, port = serve(TETHER, db, tls, peers, db, timeout=60)
    procs.append(p)
    errs.append(err)
    return port


started = time.time()
hub_port = start(dbs[0], [])
for db in dbs[1:]:
    start(db, ["--peer", f"127.0.0.1:{hub_port}"])
print(f"hub and {N} nodes listening after {time.time() - started:.1f} s", flush=True)


def sessions_started():
    return sum(1 for _, line in errs[0] if "sync session started" in line)


deadline = time.time() + 300
while sessions_started() < N and time.time() < deadline:
    time.sleep(0.2)
print(f"links up: the hub started {sessions_started()} sessions for {N} nodes, {time.time() - started:.1f} s after the start", flush=True)

# Idle: every link up, nothing written.
time.sleep(2)
before = [cpu_seconds(p.pid) for p in procs]
time.sleep(IDLE)
after = [cpu_seconds(p.pid) for p in procs]
used = [a - b for a, b in zip(after, before)]
print(f"idle over {IDLE:.0f} s: all processes {100 * sum(used) / IDLE:.1f} % of a core "
      f"(hub {100 * used[0] / IDLE:.2f} %, nodes {100 * sum(used[1:]) / IDLE / N:.3f} % each on average); "
      f"load average {os.getloadavg()[0]:.1f}", flush=True)

# Convergence: every node writes ROWS rows at once.
write_start = time.time()


def write(i):
    first = i * ROWS
    run("sql", "--db", dbs[i], f"WITH RECURSIVE s(x) AS (SELECT {first} UNION ALL SELECT x + 1 FROM s WHERE x < {first + ROWS - 1}) "
        f"INSERT INTO t (id, body, n) SELECT x, 'node {i} row ' || x, {i} FROM s")


writers = [threading.Thread(target=write, args=(i,)) for i in range(1, N + 1)]
for w in writers: w.start()
for w in writers: w.join()
written = time.time()
total = N * ROWS
print(f"written: {total} rows on {N} nodes in {written - write_start:.1f} s", flush=True)
converged = None
counts = []
while time.time() - write_start < TIMEOUT:
    counts = [count(db) for db in dbs]
    if all(c == total for c in counts):
        converged = time.time()
        break
    time.sleep(1)
if converged:
    print(f"converged: the hub and every node hold {total} rows, {converged - write_start:.1f} s after the writes began", flush=True)
else:
    short = sum(1 for c in counts if c != total)
    print(f"NOT converged after {TIMEOUT:.0f} s: {short} databases short", flush=True)
timeouts = sum(1 for err in errs for _, line in err if "timed out" in line.lower())
failures = sum(1 for err in errs for _, line in err if "sync session failed" in line or "error" in line.lower())
for p in procs: p.terminate()
codes = [p.wait(timeout=120) for p in procs]
print(f"exit codes: {sorted(set(codes))}; log lines naming a timeout: {timeouts}; failures or errors: {failures}")
