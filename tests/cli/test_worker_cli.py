"""``lonnymq worker``: signal handling and exit codes, in-process (the subprocess runs are in
tests/acceptance)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from types import FrameType

import pytest

from lonnymq import Client
from lonnymq.cli import main
from lonnymq.cli.worker import _serve, load_app
from lonnymq.worker import App, Worker


def test_signals_stop_gracefully_then_hard_and_handlers_are_restored(
    dsn: str, schema: str, client: Client
) -> None:
    client.create_queue("jobs")
    client.send_batch("jobs", ["quick", "stuck"])
    app = App()
    finished: list[str] = []
    started = threading.Event()

    @app.handler("jobs")
    async def work(job):  # type: ignore[no-untyped-def]
        if job.payload == "stuck":
            started.set()
            await asyncio.sleep(600)
        finished.append(job.payload)

    def mine(signum: int, frame: FrameType | None) -> None:
        raise AssertionError("the worker's handler should be installed")

    before = signal.signal(signal.SIGTERM, mine)
    try:

        def send_signals() -> None:
            started.wait(120)
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGTERM)  # graceful: would wait 600 s for "stuck"...
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGINT)  # ...so the second signal stops it hard

        threading.Thread(target=send_signals, daemon=True).start()
        t0 = time.monotonic()
        rc = asyncio.run(_serve(Worker(app, dsn, schema=schema, shutdown_timeout=600)))
        assert rc == 0 and time.monotonic() - t0 < 120  # not the 600 s (room for a loaded machine)
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)
    assert finished == ["quick"]
    m = client.metrics("jobs")
    assert (m.ready, m.leased) == (1, 0)  # "stuck" was released for others


def test_setup_errors_exit_2(dsn: str, schema: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--dsn", dsn, "--schema", schema]
    assert main(["worker", "no_such_module_xyz:app", *base]) == 2
    assert "cannot import" in capsys.readouterr().err
    assert main(["worker", "lonnymq:Client", *base]) == 2  # a class, not an App (and not called)
    assert "not a lonnymq.worker.App" in capsys.readouterr().err
    assert main(["worker", "lonnymq.worker:App", *base]) == 2
    assert "is a type, not a lonnymq.worker.App" in capsys.readouterr().err
    with pytest.raises(Exception, match="MODULE:ATTR"):
        load_app("just_a_module")
