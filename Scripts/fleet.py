"""What Scripts/serve-chain.py and Scripts/serve-star.py share: running `tether`, reading a
process's output as it comes, counting a node's rows."""
import sqlite3, subprocess, sys, time


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
