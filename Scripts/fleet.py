"""What Scripts/serve-chain.py and Scripts/serve-star.py share: running `tether`, starting a
`tether serve` node, reading a process's output as it comes, counting a node's rows."""
import sqlite3, subprocess, sys, threading, time


def run(tether, *args):
    """Runs `tether ARGS`; exits with its error output if it fails."""
    out = subprocess.run([tether, *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"tether {' '.join(args)} failed: {out.stderr}")
    return out.stdout


def pump(stream, sink):
    """Appends each line of `stream` to `sink` with the time it came, until the stream ends."""
    for line in iter(stream.readline, ""):
        sink.append((time.time(), line.rstrip("\n")))


def serve(tether, db, tls, peers, name, timeout):
    """Starts `tether serve` on `db` (loopback, any port, log level info) linked to `peers`, and
    waits for its "listening on" line; returns the process, its stdout and stderr lines as they
    come (see `pump`), and its port. Exits if it has not started within `timeout` seconds."""
    p = subprocess.Popen([tether, "serve", "--db", db, "--listen", "127.0.0.1:0", "--log-level", "info", *tls, *peers],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    out, err = [], []
    threading.Thread(target=pump, args=(p.stdout, out), daemon=True).start()
    threading.Thread(target=pump, args=(p.stderr, err), daemon=True).start()
    deadline = time.time() + timeout
    while not any(line.startswith("listening on") for _, line in out):
        if time.time() > deadline or p.poll() is not None:
            sys.exit(f"{name} did not start: {out} {err}")
        time.sleep(0.02)
    line = next(line for _, line in out if line.startswith("listening on"))
    return p, out, err, int(line.split()[2].rsplit(":", 1)[1])


def count(db):
    """The rows of table t in the database at `db` (-1 while it cannot be read)."""
    try:
        c = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return c.execute("SELECT count(*) FROM t").fetchone()[0]
        finally:
            c.close()
    except sqlite3.Error:
        return -1
