"""Writers that create the same tenant and app at the same moment, as replicas starting together on a new
PostgreSQL store do (each makes its starter key for app "starter" of tenant "default"): all succeed, and the store
holds one tenant and one app."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import text

from turnout.store.db import Database

WRITER = """
import pathlib, sys, time
from turnout.store.db import Database
from turnout.store.keys import KeyStore

url, start = sys.argv[1], pathlib.Path(sys.argv[2])
db = Database(url)
db.migrate()
keys = KeyStore(db)
keys.count()  # connected
(start.parent / (start.name + "." + sys.argv[3])).touch()
deadline = time.monotonic() + 30
while not start.exists() and time.monotonic() < deadline:
    time.sleep(0.001)
keys.create(app="starter", tenant=None, scopes=["*"], rpm=None, daily_tokens=None, expires_at=None, now=time.time())
db.close()
"""


def test_replicas_creating_the_first_app_at_once_all_succeed(postgres_database: str, tmp_path: Path) -> None:
    db = Database(postgres_database)
    db.migrate()  # the migration's own race is test_migrate's
    start = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, postgres_database, str(start), str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(3)
    ]
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"go.{i}").exists() for i in range(3)) and time.monotonic() < deadline:
            time.sleep(0.01)
        start.touch()
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in results]
    with db.engine.connect() as conn:
        counts = [conn.execute(text(f"SELECT count(*) FROM {t}")).scalar() for t in ("tenants", "apps", "keys")]
    db.close()
    assert counts == [1, 1, 3]
