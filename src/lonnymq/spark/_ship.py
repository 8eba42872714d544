"""Shipping lonnymq to Spark's Python processes that do not have it installed.

Spark puts ``.zip`` files given as Python files (``--py-files``, ``addPyFile``, ``addArtifacts(...,
pyfile=True)``) on the path of most of its Python workers, but not of all: it starts the
planner of a streaming read with the files of a fixed ``streaming_job`` folder, where nothing
is ever shipped, and through Spark Connect the tasks of a streaming query did not get the
session's files either. So :func:`shipped_source` makes a data source class that cloudpickle
ships by value, with the zip inside, and the readers and writers it returns pickle as "put the
zip on ``sys.path``, then rebuild": no process depends on Spark having shipped the zip.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import os
import pickle
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # PySpark is imported by shipped_source only: package_zip needs none
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceReader,
        DataSourceStreamReader,
        DataSourceStreamWriter,
        DataSourceWriter,
    )
    from pyspark.sql.types import StructType

#: Fixed timestamp of the zip's entries, so the same sources make the same bytes and name.
_EPOCH = (1980, 1, 1, 0, 0, 0)


def imported_zip() -> Path | None:
    """The zip this process imported lonnymq from (``--py-files``), or None."""
    import lonnymq

    archive = getattr(lonnymq.__spec__.loader, "archive", None) if lonnymq.__spec__ else None
    return Path(archive) if archive else None


def package_bytes() -> bytes:
    """The imported ``lonnymq`` package as a zip: deterministic (sorted entries, fixed
    times), so the same sources give the same bytes."""
    import lonnymq

    root = Path(lonnymq.__file__).resolve().parent
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(root.rglob("*")):
            if path.is_dir() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            info = zipfile.ZipInfo(f"lonnymq/{path.relative_to(root).as_posix()}", _EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, path.read_bytes())
    return buf.getvalue()


class _ByValue(NamedTuple):
    private_dir: Callable[[], Path]
    write_once: Callable[[Path, bytes], None]
    load: Callable[[str, bytes], None]
    portable: Callable[[Any, str, bytes], Any]


def _by_value() -> _ByValue:
    # Nested, so cloudpickle ships these functions by value with the objects that use them:
    # the process that unpickles those may not be able to import this module.

    def private_dir() -> Path:
        """This user's folder for lonnymq's zips under the temporary directory, readable by
        the user only; a fresh one if someone else owns that folder or can write to it."""
        path = Path(tempfile.gettempdir()) / f"lonnymq-spark-{os.getuid()}"
        try:
            path.mkdir(mode=0o700, exist_ok=True)
            st = path.lstat()
            if path.is_symlink() or st.st_uid != os.getuid() or st.st_mode & 0o077:
                raise PermissionError(path)
        except OSError:
            return Path(tempfile.mkdtemp(prefix="lonnymq-spark-"))
        return path

    def write_once(path: Path, data: bytes) -> None:
        """Make ``path`` hold ``data``: left alone if it does, else replaced atomically."""
        if not (path.is_file() and path.read_bytes() == data):
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_bytes(data)
            tmp.replace(path)

    def load(name: str, data: bytes) -> None:
        """Put the zip ``data`` first on ``sys.path``, unless this process has imported
        lonnymq already: every process of a query then runs the lonnymq that shipped it."""
        if "lonnymq" not in sys.modules:
            path = private_dir() / name
            write_once(path, data)
            sys.path.insert(0, str(path))

    def rebuild(name: str, data: bytes, module: str, qualname: str, state: bytes) -> Any:
        load(name, data)
        cls: Any = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
        obj = cls.__new__(cls)
        values = pickle.loads(state)
        if hasattr(obj, "__setstate__"):
            obj.__setstate__(values)
        elif values:
            obj.__dict__.update(values)
        return portable(obj, name, data)

    def portable(obj: Any, name: str, data: bytes) -> Any:
        """``obj`` (a reader or writer of lonnymq), pickled from now on as a call that loads
        the zip and then rebuilds it from its state: unpickling it needs no lonnymq."""
        real = type(obj)

        def __reduce__(self: Any) -> tuple[Any, ...]:
            from pyspark import cloudpickle

            state = cloudpickle.dumps(self.__getstate__())  # type: ignore[no-untyped-call]
            return rebuild, (name, data, real.__module__, real.__qualname__, state)

        obj.__class__ = type(
            real.__name__,
            (real,),
            {"__reduce__": __reduce__, "__module__": real.__module__, "__qualname__": real.__qualname__},
        )
        return obj

    return _ByValue(private_dir, write_once, load, portable)


_BY_VALUE = _by_value()
private_dir = _BY_VALUE.private_dir


def package_zip(directory: str | os.PathLike[str] | None = None) -> Path:
    """Build ``lonnymq-<version>-<digest>.zip`` of the imported lonnymq package (pure Python,
    :func:`package_bytes`) in ``directory`` (default: a private folder under the temporary
    directory), unless that file holds it already, and return its path: what
    :func:`lonnymq.spark.ship` sends, and what ``spark-submit --py-files`` takes (Spark puts
    zips on the Python path, not wheels; ``python -m lonnymq.spark [DIR]`` prints it). Without
    ``directory``, in a process that imported lonnymq from a zip, that zip. The name changes
    with the contents: Spark refuses a second file of the same name with other contents."""
    from lonnymq import __version__

    if directory is None and (imported := imported_zip()) is not None:
        return imported
    data = package_bytes()
    folder = Path(directory) if directory is not None else private_dir()
    path = folder / f"lonnymq-{__version__}-{hashlib.sha256(data).hexdigest()[:16]}.zip"
    _BY_VALUE.write_once(path, data)
    return path


def shipped_source(conf: Mapping[str, str], archive: Path) -> type[DataSource]:
    """``format("lonnymq")`` carrying the zip ``archive`` (of :func:`package_zip`) and ``conf`` (as
    :func:`lonnymq.spark.source.with_conf`). Defined here, so cloudpickle ships the class by value:
    its only base is PySpark's, and its methods use nothing of lonnymq until
    :meth:`_delegate` has put the zip on ``sys.path`` (in a process that has not imported
    lonnymq yet, so every process of the query runs the driver's lonnymq); each method then
    hands over to the real :class:`~lonnymq.spark.source.LonnyMQDataSource`."""
    from pyspark.sql.datasource import DataSource

    captured = dict(conf)
    name, data = archive.name, archive.read_bytes()
    load, portable = _BY_VALUE.load, _BY_VALUE.portable

    class LonnyMQDataSource(DataSource):
        conf = captured

        @classmethod
        def name(cls) -> str:
            return "lonnymq"

        def _delegate(self) -> DataSource:
            load(name, data)
            from lonnymq.spark.source import LonnyMQDataSource as Real
            from lonnymq.spark.source import with_conf

            cls = with_conf(self.conf) if self.conf else Real
            return cls(self.options)

        def __repr__(self) -> str:
            return repr(self._delegate())

        def schema(self) -> StructType | str:
            return self._delegate().schema()

        def reader(self, schema: StructType) -> DataSourceReader:
            return portable(self._delegate().reader(schema), name, data)  # type: ignore[no-any-return]

        def streamReader(self, schema: StructType) -> DataSourceStreamReader:
            return portable(self._delegate().streamReader(schema), name, data)  # type: ignore[no-any-return]

        def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
            return portable(self._delegate().writer(schema, overwrite), name, data)  # type: ignore[no-any-return]

        def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
            return portable(self._delegate().streamWriter(schema, overwrite), name, data)  # type: ignore[no-any-return]

    LonnyMQDataSource.__qualname__ = "shipped_source.<locals>.LonnyMQDataSource"
    return LonnyMQDataSource
