"""Optional parts used without their extra: a typed ImportError naming the extra to install
(``pip install 'lonnymq[web]'``), not a bare ``ModuleNotFoundError: jinja2``. Each runs in a
subprocess where the extra's module is made unimportable (``sys.modules[name] = None``), so the
test needs no second environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import lonnymq

SRC = str(Path(lonnymq.__file__).resolve().parent.parent)

PROBE = """
import sys
sys.modules[{module!r}] = None  # as if the extra were not installed
from lonnymq import errors
try:
{call}
except ImportError as e:
    assert isinstance(e, errors.MissingExtra), type(e)
    assert isinstance(e, ModuleNotFoundError) and isinstance(e, errors.LonnyMQError)
    print(e.name)
    print(e)
else:
    raise SystemExit("no error")
"""


@pytest.mark.parametrize(
    ("module", "call", "extra"),
    [
        ("jinja2", "    import lonnymq.web", "web"),
        ("starlette", "    from lonnymq.web import create_app", "web"),
        ("orjson", "    from lonnymq.serializer import OrjsonSerializer; OrjsonSerializer()", "orjson"),
    ],
)
def test_a_missing_extra_names_what_to_install(module: str, call: str, extra: str) -> None:
    env = {**os.environ, "PYTHONPATH": SRC}
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module, call=call)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    name, message = out.stdout.splitlines()
    assert name.split(".")[0] == module
    assert f"pip install 'lonnymq[{extra}]'" in message and module in message
