"""Data files behind fsspec URLs (``s3://``, ``gs://``, ...): finding them and reading bytes.

A URL is read through fsspec and its driver (``s3fs`` for ``s3://``), configured the way
those libraries are everywhere: the endpoint and other options from fsspec's config
(``FSSPEC_S3_ENDPOINT_URL=...``, or ``FSSPEC_S3='{"endpoint_url": ...}'``), credentials
from the store's own chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``~/.aws``,
an instance role). Nothing secret goes into the job spec, which is saved with the run.

Reads are byte ranges (one ranged GET each): a worker fetches its shard, never the whole
object. A store's own exceptions become one-line :class:`DataError` s naming the URL.
"""

from __future__ import annotations

import glob
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

from dlrover.errors import DataError


def local_path(path: str) -> str:
    """``file:///x`` -> ``/x``: local files are read directly, whichever way they are named."""
    return path.removeprefix("file://")


def protocols(url: str) -> list[str]:
    """The fsspec protocols of a URL, outermost first (``simplecache::s3://b/k`` has two)."""
    return [part.split("://", 1)[0] if "://" in part else part for part in url.split("::")]


def unknown_protocol(url: str) -> str | None:
    """The first protocol of ``url`` that fsspec does not know, or None (no driver imported)."""
    import fsspec

    known = set(fsspec.available_protocols())
    return next((p for p in protocols(url) if p not in known), None)


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or e.__class__.__name__
    return text.splitlines()[0]


@contextmanager
def store_errors(what: str) -> Iterator[None]:
    """Turn what a store raises into a one-line DataError starting with ``what``.

    Store drivers raise their own exception types (botocore, aiohttp, google-auth), so
    anything but a DataError is caught here, at the I/O boundary."""
    try:
        yield
    except DataError:
        raise
    except FileNotFoundError:
        raise DataError(f"{what}: no such file") from None
    except PermissionError as e:
        raise DataError(f"{what}: access denied: {_first_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - see the docstring
        raise DataError(f"{what}: {e.__class__.__name__}: {_first_line(e)}") from None


BUCKET_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})  # a path's first part is its bucket


def filesystem(url: str, what: str) -> tuple[Any, str]:
    """(fsspec filesystem, path inside it) for ``url``; an unknown scheme or a missing
    driver (``gs://`` without gcsfs) is a DataError starting with ``what``."""
    from fsspec.core import url_to_fs

    bad = unknown_protocol(url)
    if bad is not None:
        raise DataError(f"{what}: unknown storage scheme {bad!r}")
    try:
        return url_to_fs(url)
    except ImportError as e:
        raise DataError(f"{what}: {_first_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - drivers validate their options in their own ways
        raise DataError(f"{what}: cannot open the store: {_first_line(e)}") from None


def expand_url(pattern: str, accept: Callable[[str], bool]) -> list[str]:
    """Files (as full URLs) that a URL names: itself, the files of a directory (prefix),
    or a glob's matches, kept when ``accept(name)``. An unreachable store is a DataError
    naming ``data.paths`` here, rather than a silent "matches nothing"."""
    what = f"data.paths: {pattern}"
    fs, root = filesystem(pattern, what)
    with store_errors(what):
        if glob.has_magic(root):
            entries = list(fs.glob(root, detail=True).values())
        else:
            try:
                info = fs.info(root)
                entries = fs.ls(root, detail=True) if info["type"] == "directory" else [info]
            except FileNotFoundError:
                entries = []
    found = [fs.unstrip_protocol(e["name"]) for e in entries if e["type"] == "file" and accept(e["name"])]
    bucket = root.split("/")[0]
    if not found and protocols(pattern)[-1] in BUCKET_STORES and bucket:
        with store_errors(what):
            exists = fs.exists(bucket)
        if not exists:
            raise DataError(f"{what}: bucket {bucket!r} does not exist (or these credentials cannot see it)")
    return found


def open_url(url: str, block_size: int | None = None) -> IO[bytes]:
    """A file object over ``url`` for sequential reading (indexing, whole-file formats)."""
    fs, path = filesystem(url, url)
    with store_errors(url):
        return fs.open(path, "rb", block_size=block_size)


def open_ranged(url: str) -> IO[bytes]:
    """A file object over ``url`` that fetches exactly what each read asks for (no
    read-ahead): for readers such as Parquet's that plan their own ranges."""
    fs, path = filesystem(url, url)
    with store_errors(url):
        return fs.open(path, "rb", cache_type="none")


def read_range(url: str, start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)`` of ``url``, in one ranged request."""
    fs, path = filesystem(url, url)
    with store_errors(url):
        return fs.cat_file(path, start=start, end=stop)


def size_of(url: str) -> int:
    """The object's size in bytes."""
    fs, path = filesystem(url, url)
    with store_errors(url):
        return int(fs.size(path))

