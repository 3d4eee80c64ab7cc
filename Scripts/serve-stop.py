#!/usr/bin/env python3
"""Stops `tether serve` with SIGTERM again and again, at the moment it says "listening on" (and,
with WHEN=starting, at a random moment while it starts), and counts the runs that did not exit
within TIMEOUT seconds: each must exit, 0 once it has said "listening on". Several run at once
(PARALLEL) to load the machine as the test suite does. Outside the test suite:

    swift build && RUNS=200 python3 Scripts/serve-stop.py .build/debug/tether

Environment: RUNS (200), PARALLEL (4), WHEN (listening or starting), TIMEOUT in seconds (5),
WORK (a scratch directory, emptied first)."""
import os, random, shutil, signal, subprocess, sys, threading
from fleet import run as run_tether

TETHER = sys.argv[1]
RUNS = int(os.environ.get("RUNS", "200"))
PARALLEL = int(os.environ.get("PARALLEL", "4"))
WHEN = os.environ.get("WHEN", "listening")
TIMEOUT = float(os.environ.get("TIMEOUT", "5"))
WORK = os.environ.get("WORK", "/tmp/tether-serve-stop")
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)

run_tether(TETHER, "cert", "ca", "--out", f"{WORK}/ca")
run_tether(TETHER, "cert", "node", "--ca", f"{WORK}/ca", "--name", "node", "--out", f"{WORK}/cert")
tls = ["--cert", f"{WORK}/cert/cert.pem", "--key", f"{WORK}/cert/key.pem", "--ca", f"{WORK}/ca/ca.pem"]
with open(f"{WORK}/schema.sql", "w") as f:
    f.write("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT);\n")
# A database per worker: two nodes on one file would share its lock, not what is tested here.
for worker in range(PARALLEL):
    run_tether(TETHER, "init", "--db", f"{WORK}/w{worker}.db", "--schema", f"{WORK}/schema.sql", "--sync", "t")

lock = threading.Lock()
outcomes = {"exit 0": 0, "other exit": 0, "killed by SIGTERM": 0, "did not exit": 0}
failures = []


def one_run(worker):
    p = subprocess.Popen([TETHER, "serve", "--db", f"{WORK}/w{worker}.db", "--listen", "127.0.0.1:0",
                          "--log-level", "info", *tls],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    err = []
    threading.Thread(target=lambda: err.extend(p.stderr), daemon=True).start()
    listening = False
    if WHEN == "starting":
        # Anywhere in the start-up, which takes some tens of milliseconds in a debug build.
        threading.Event().wait(random.uniform(0, 0.15))
    else:
        for line in p.stdout:
            if line.startswith("listening on"):
                listening = True
                break
    p.send_signal(signal.SIGTERM)
    try:
        status = p.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        status = None
    rest = p.stdout.read()
    listening = listening or "listening on" in rest
    if status == 0:
        outcome = "exit 0"
    elif status is None:
        outcome = "did not exit"
    elif status == -signal.SIGTERM and not listening:
        # Before the node set up its handling of SIGTERM, the signal's default action ends it.
        outcome = "killed by SIGTERM"
    else:
        outcome = "other exit"
    with lock:
        outcomes[outcome] += 1
        if outcome in ("did not exit", "other exit"):
            failures.append(f"status {status}, listening {listening}, stderr:\n{''.join(err)}")


def worker_loop(worker, runs):
    for _ in range(runs):
        one_run(worker)


threads = [threading.Thread(target=worker_loop, args=(w, RUNS // PARALLEL + (w < RUNS % PARALLEL))) for w in range(PARALLEL)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(f"{RUNS} runs, SIGTERM when {WHEN}: " + ", ".join(f"{k} {v}" for k, v in outcomes.items()))
for failure in failures[:5]:
    print("---\n" + failure)
sys.exit(1 if failures else 0)
