"""Creating a cluster: ``initdb`` into a staging directory renamed into place only when it
succeeded, so an interrupted initdb never leaves a half-made cluster behind."""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

from ..errors import EmbeddedServerError
from ._host import SUPERUSER, Account, chown, grant_traverse, run_binary

_logger = logging.getLogger(__name__)

INITDB_TIMEOUT = 300.0


def initdb(data_dir: Path, account: Account | None) -> None:
    """Initialise a cluster in `data_dir` (absent or empty): trust auth, UTF8, C locale,
    superuser ``postgres``. The caller holds the data directory's lock."""
    if data_dir.exists() and any(data_dir.iterdir()):
        raise EmbeddedServerError(
            f"{data_dir} exists, is not empty and holds no PostgreSQL cluster "
            "(no PG_VERSION); refusing to initialise it"
        )
    staging = data_dir.parent / f".{data_dir.name}.initdb"
    if staging.exists():
        shutil.rmtree(staging)  # left by an interrupted run; we hold the lock
    target = staging
    existed = data_dir.exists()
    if existed:
        try:
            data_dir.rmdir()  # replaced atomically by the staging dir below
        except OSError:
            target = data_dir  # e.g. a mount point: initdb in place
    target.mkdir(mode=0o700, exist_ok=target == data_dir)
    target.chmod(0o700)
    chown(target, account)
    grant_traverse(target, account)
    started = time.monotonic()
    rc, output = run_binary(
        "initdb",
        [
            "-D",
            str(target),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            # C locale: byte-order sorting, independent of the host's locales.
            "--no-locale",
            "--no-instructions",
        ],
        timeout=INITDB_TIMEOUT,
    )
    if rc != 0:
        if target == staging:
            shutil.rmtree(staging, ignore_errors=True)
            if existed:
                data_dir.mkdir(exist_ok=True)  # give back the caller's empty dir
        raise EmbeddedServerError(f"initdb failed for {data_dir} (exit {rc}):\n{output.strip()}")
    if target == staging:
        os.rename(staging, data_dir)
    _logger.info("initdb %s took %.2fs", data_dir, time.monotonic() - started)
