"""`hymt-download` and the pinned, resumable, verified model download (REFERENCE.md §10.4, §11).

``download_file`` streams a URL into ``<dest>.part`` while hashing it, resumes an interrupted ``.part``
with an HTTP ``Range`` request, retries transient failures with exponential back-off, and only renames
the file into place once its size and SHA-256 match the pins. ``ensure_default_model`` is what programs
call when no ``--model`` is given: verify the default file if present, download it otherwise.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

import requests
from tqdm import tqdm

from hymt.cli import ArgumentParser, data_dir
from hymt.errors import DownloadError
from hymt.gguf import file_sha256, remember_file_sha256

DEFAULT_ENDPOINT = "https://huggingface.co"
CONNECT_TIMEOUT_SECONDS = 30.0
# Seconds without a single byte before a stalled transfer is dropped (and retried, resuming the .part).
READ_TIMEOUT_SECONDS = 60.0
RETRIES = 4
RETRY_BACKOFF_SECONDS = 1.0  # doubled after every failed attempt
TRANSIENT_HTTP_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
# Bytes per read: an interrupted read loses at most this much of what was in flight.
CHUNK_BYTES = 256 * 1024
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


@dataclass(frozen=True)
class ModelFile:
    """One official GGUF file, pinned by repository revision, size and SHA-256 (§11)."""

    key: str
    repo: str
    revision: str
    filename: str
    size: int
    sha256: str

    def url(self, endpoint: str | None = None) -> str:
        base = hf_endpoint() if endpoint is None else endpoint.rstrip("/")
        return f"{base}/{self.repo}/resolve/{self.revision}/{self.filename}?download=true"


_REPO_1_8B = ("tencent/Hy-MT2-1.8B-GGUF", "a0c709d9fac510f2c807aa3af52872340dc37a4a")
_REPO_7B = ("tencent/Hy-MT2-7B-GGUF", "ab8472660ac61fac25f1af43fac2599d52a8a775")
_REPO_30B = ("tencent/Hy-MT2-30B-A3B-GGUF", "fd3dcbb6b31e9e03923ef4f9f42500f74c3851c3")

# §11.1 gives repository and revision for every file; §11.2 names the 1.8B repository and revision, and its
# 7B and 30B files sit in the same repositories (and revisions) as the §11.1 7B and 30B files.
OFFICIAL_FILES: dict[str, ModelFile] = {
    f.key: f
    for f in (
        ModelFile(
            "stq",
            "tencent/Hy-MT2-1.8B-1.25Bit-GGUF",
            "9df5c824a00a744fb0512a29c640466f4d97dfb0",
            "Hy-MT2-1.8B-1.25Bit.gguf",
            461860800,
            "cc497fe8f033b52b3b8b00a7669e9661435432f9d4cd43f7ed24400c01507a93",
        ),
        ModelFile(
            "q2c",
            "tencent/Hy-MT2-1.8B-2Bit-GGUF",
            "b630487d19ab7f336664a15b07c638d0d1071471",
            "Hy-MT2-1.8B-2Bit.gguf",
            600534880,
            "dcc33bbae9b28d923c8c76a64f6157840841d26f8774f3dfd770d5fabeeb1cd7",
        ),
        ModelFile(
            "1.8b-q4_k_m",
            *_REPO_1_8B,
            "Hy-MT2-1.8B-Q4_K_M.gguf",
            1133080448,
            "dc5f44fcf1fa496ee7ad725982c0c8c553a4de00259b53af84c4b89fb0c06699",
        ),
        ModelFile(
            "1.8b-q6_k",
            *_REPO_1_8B,
            "Hy-MT2-1.8B-Q6_K.gguf",
            1474785120,
            "d98fe604dec1f28f58f80d7d560f7177e584d3b8e5835862687660e5ff97cb40",
        ),
        ModelFile(
            "1.8b-q8_0",
            *_REPO_1_8B,
            "Hy-MT2-1.8B-Q8_0.gguf",
            1908528192,
            "5c3fe0b1408a5ceb0143184ef247b11b579c525f4b02b060e6c851bb76fef1a4",
        ),
        ModelFile(
            "7b-q4_k_m",
            *_REPO_7B,
            "Hy-MT2-7B-Q4_K_M.gguf",
            4624648896,
            "9f96256500f3fc1ab4d64336b58f52a949a95ad7516b0c229476eef782f9f77b",
        ),
        ModelFile(
            "7b-q6_k",
            *_REPO_7B,
            "HY-MT2-7B-Q6_K.gguf",
            6164482720,
            "88ef0aba59952a4cfe4be36cb5baf797dbb370bc60e9dcbd7297036021e52831",
        ),
        ModelFile(
            "7b-q8_0",
            *_REPO_7B,
            "HY-MT2-7B-Q8_0.gguf",
            7981928896,
            "58b3ad55dd6f6fa08c695cddc34fb5f8f708a844f78ae10508071914b0ed67c0",
        ),
        ModelFile(
            "30b-q4_k_m",
            *_REPO_30B,
            "Hy-MT2-30B-A3B-Q4_K_M.gguf",
            18236702880,
            "bb44b11bb0f7cd3d1321645b41e911cd3de2e473731227fc6bf37aa18b543f88",
        ),
        ModelFile(
            "30b-q8_0",
            *_REPO_30B,
            "Hy-MT2-30B-A3B-Q8_0.gguf",
            31985729376,
            "d4e74d3b9479db5a7e2e4728879e15554b385e9549b411cc8b0ad03b2970ce98",
        ),
    )
}
DEFAULT_MODEL = OFFICIAL_FILES["stq"]


def hf_endpoint() -> str:
    """The hub base URL: ``$HF_ENDPOINT`` (trailing ``/`` trimmed) or https://huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/") or DEFAULT_ENDPOINT


def default_model_path(directory: str | os.PathLike[str]) -> Path:
    return Path(directory) / DEFAULT_MODEL.filename


def ensure_default_model(directory: str | os.PathLike[str]) -> Path:
    """Verify the default model in ``directory`` (downloading it when missing or corrupt); its path."""
    return ensure_model(DEFAULT_MODEL, directory)


def ensure_model(model: ModelFile, directory: str | os.PathLike[str], *, force: bool = False) -> Path:
    return download_file(
        model.url(), Path(directory) / model.filename, model.sha256, model.size, force=force, model_hint=True
    )


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class _Restart(Exception):
    """The server cannot continue the ``.part``: discard it and start again from byte 0."""


class _Interrupted(Exception):
    """A transient failure; the ``.part`` is kept and the next attempt resumes it."""


class _Unreachable(_Interrupted):
    """No connection to the server could be made (DNS failure, refused, connect timeout)."""


class _TransientStatus(_Interrupted):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


def download_file(
    url: str,
    dest: str | os.PathLike[str],
    sha256: str,
    size: int | None,
    *,
    session: requests.Session | None = None,
    force: bool = False,
    retries: int | None = None,
    read_timeout: float | None = None,
    progress: bool = True,
    model_hint: bool = False,
) -> Path:
    """Make ``dest`` a verified copy of ``url`` (``size`` bytes, SHA-256 ``sha256``) and return its path.

    An existing file of the right size and digest is reused without any request. ``retries`` transient
    failures (connection errors, timeouts, HTTP 408/425/429/5xx, short bodies) are retried with
    exponential back-off, each retry resuming the ``.part``. ``model_hint`` adds the ``--model`` /
    ``HF_ENDPOINT`` advice to network errors (for programs that download the default model).
    """
    dest = Path(dest)
    part = dest.with_name(dest.name + ".part")
    expected = sha256.lower()
    # Checked first: a folder in the file's place would only fail at the final rename, after the download.
    if dest.parent.exists() and not dest.parent.is_dir():
        raise DownloadError(f"download folder {dest.parent} is not a directory")
    if dest.is_dir():
        raise DownloadError(f"{dest} is a directory, not a model file; move it away or choose another --dir")
    dest.parent.mkdir(parents=True, exist_ok=True)

    with _exclusive(dest):
        if force:
            for stale in (dest, part):
                stale.unlink(missing_ok=True)
        elif dest.exists():
            if _existing_file_ok(dest, expected, size):
                return dest

        retries = RETRIES if retries is None else retries
        read_timeout = READ_TIMEOUT_SECONDS if read_timeout is None else read_timeout
        own_session = session is None
        session = requests.Session() if session is None else session
        # Identity encoding: the bytes hashed must be the bytes of the file, and Content-Length must count
        # them.
        headers = {"Accept-Encoding": "identity"}
        if token := os.environ.get("HF_TOKEN"):
            headers["Authorization"] = f"Bearer {token}"
        try:
            attempt = 0
            while True:
                try:
                    digest = _transfer(
                        session, url, part, size, headers, (CONNECT_TIMEOUT_SECONDS, read_timeout), progress
                    )
                    break
                except _Restart:
                    part.unlink(missing_ok=True)
                except _Interrupted as exc:
                    # An unreachable host is retried once, not `retries` times: offline machines should hear
                    # so fast.
                    if attempt >= (min(retries, 1) if isinstance(exc, _Unreachable) else retries):
                        raise DownloadError(_network_message(url, exc, model_hint)) from None
                    delay = RETRY_BACKOFF_SECONDS * 2**attempt
                    attempt += 1
                    _say(f"Download from {url} failed ({_describe(exc)}); retrying in {delay:g} s...")
                    time.sleep(delay)
        finally:
            if own_session:
                session.close()

        if digest != expected:
            part.unlink(missing_ok=True)
            raise DownloadError(f"Checksum mismatch for downloaded model: expected {expected}, got {digest}")
        os.replace(part, dest)
        _fsync_directory(dest.parent)
        remember_file_sha256(dest, digest)
        _say(f"Successfully downloaded and verified {dest}")
        return dest


@contextlib.contextmanager
def _exclusive(dest: Path) -> Iterator[None]:
    """An advisory lock beside ``dest`` (``.<name>.lock``, left in place) for the whole check-or-download.

    Two programs ensuring the same model at once (a service and a manual run) would otherwise both write
    into the same ``.part`` and end in a checksum mismatch; the later one waits, then finds the file the
    earlier one verified. No-op where ``fcntl`` does not exist.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    try:
        fd = os.open(dest.with_name(f".{dest.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # a read-only model folder: verifying needs no lock, and a download fails on its own
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(f"Waiting for another download of {dest} to finish...")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _existing_file_ok(dest: Path, expected: str, size: int | None) -> bool:
    if size is not None and dest.stat().st_size != size:
        _say(f"Existing file at {dest} has incorrect size; re-downloading...")
        return False
    _say(f"Verifying existing model at {dest}")
    if file_sha256(dest) == expected:
        _say(f"Model at {dest} verified successfully")
        return True
    _say(f"Checksum mismatch for {dest}; re-downloading...")
    return False


def _transfer(
    session: requests.Session,
    url: str,
    part: Path,
    size: int | None,
    headers: dict[str, str],
    timeout: tuple[float, float],
    progress: bool,
) -> str:
    """One GET into ``part`` (resuming it when possible); the SHA-256 of the finished part."""
    offset = part.stat().st_size if part.exists() else 0
    if size is not None and offset >= size:
        raise _Restart  # a .part not smaller than the whole file cannot be resumed
    request_headers = dict(headers)
    if offset:
        request_headers["Range"] = f"bytes={offset}-"
    try:
        response = session.get(
            url, headers=request_headers, stream=True, timeout=timeout, allow_redirects=True
        )
    except requests.ConnectionError as exc:  # also a connect timeout: no server answered at all
        reason = getattr(exc.args[0], "reason", None) if exc.args else None  # urllib3's root cause
        raise _Unreachable(_describe(reason or exc)) from exc
    except requests.Timeout as exc:
        raise _Interrupted(_describe(exc)) from exc
    except requests.RequestException as exc:  # invalid URL, too many redirects, ...
        raise DownloadError(f"Failed to download model from {url}: {_describe(exc)}") from exc
    with response:
        status = response.status_code
        if status == 416:
            raise _Restart
        if status in TRANSIENT_HTTP_STATUSES:
            raise _TransientStatus(status)
        if status not in (200, 206):
            raise DownloadError(f"Failed to download model from {url}: HTTP {status}")
        if status == 206:
            match = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
            if match is None or int(match.group(1)) != offset:
                raise _Restart
        else:
            offset = 0  # the server ignored the Range: start over
        length = response.headers.get("Content-Length")
        total = offset + int(length) if length and length.isdigit() else size
        if size is not None and total is not None and total > size:
            raise DownloadError(
                f"Failed to download model from {url}: the server sends {total} bytes, expected {size}"
            )
        _check_disk_space(part.parent, (total if total is not None else 0) - offset)

        hasher = hashlib.sha256()
        mode = "r+b" if offset else "wb"
        with open(part, mode) as out:
            if offset:
                _hash_prefix(out, hasher, offset)
            bar = tqdm(
                total=total,
                initial=offset,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                disable=not progress,
                file=sys.stderr,
                mininterval=0.1 if sys.stderr.isatty() else 10.0,  # logs get a line every 10 s, not a flood
            )
            received = offset
            try:
                for chunk in response.iter_content(CHUNK_BYTES):
                    received += len(chunk)
                    if size is not None and received > size:
                        raise DownloadError(
                            f"Failed to download model from {url}: more than the expected {size} bytes"
                        )
                    out.write(chunk)
                    hasher.update(chunk)
                    bar.update(len(chunk))
            except requests.RequestException as exc:  # dropped or stalled mid-transfer
                raise _Interrupted(_describe(exc)) from exc
            finally:
                bar.close()
                out.flush()
                os.fsync(out.fileno())
        if size is not None and received < size:
            raise _Interrupted(f"connection closed after {received} of {size} bytes")
        return hasher.hexdigest()


def _hash_prefix(out: BinaryIO, hasher: hashlib._Hash, offset: int) -> None:
    """Hash the first ``offset`` bytes already in the ``.part`` and leave the file positioned after them."""
    out.seek(0)
    remaining = offset
    while remaining:
        chunk = out.read(min(CHUNK_BYTES, remaining))
        if not chunk:
            raise _Restart  # the .part shrank underneath us
        hasher.update(chunk)
        remaining -= len(chunk)
    out.truncate(offset)
    out.seek(offset)


def _check_disk_space(directory: Path, needed: int) -> None:
    free = shutil.disk_usage(directory).free
    if needed > free:
        raise DownloadError(
            f"Not enough disk space in {directory}: the download needs {needed} more bytes "
            f"({needed / 2**30:.2f} GiB) but only {free} are free"
        )


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # not supported on this platform; the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _network_message(url: str, exc: BaseException, model_hint: bool) -> str:
    if isinstance(exc, _TransientStatus):
        return f"Failed to download model from {url}: HTTP {exc.status}"
    if isinstance(exc, _Unreachable):
        host = urlsplit(url).netloc or url
        message = (
            f"Failed to download model from {url}: network unreachable, cannot connect to {host} ({exc})"
        )
    else:
        message = f"Failed to download model from {url}: {_describe(exc)}; run again to resume"
    if model_hint:
        message += (
            "; pass --model PATH to use a local GGUF file, or set HF_ENDPOINT to a reachable mirror "
            "(e.g. https://hf-mirror.com)"
        )
    return message


# -- the program -----------------------------------------------------------------------------------------


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="hymt-download",
        description="Download the default Hy-MT2-1.8B 1.25Bit model into the data folder.",
        epilog="Files: "
        + ", ".join(f"{key} ({f.filename}, {f.size / 1e9:.2f} GB)" for key, f in OFFICIAL_FILES.items())
        + ". Environment: HYMT_DATA_DIR, HF_ENDPOINT (e.g. https://hf-mirror.com), HF_TOKEN.",
    )
    parser.add_argument(
        "--model",
        choices=sorted(OFFICIAL_FILES),
        default=DEFAULT_MODEL.key,
        metavar="KEY",
        help=f"official file to download: {', '.join(OFFICIAL_FILES)} (default: {DEFAULT_MODEL.key})",
    )
    parser.add_argument(
        "--dir", metavar="PATH", help="destination folder (default: $HYMT_DATA_DIR, else data)"
    )
    parser.add_argument("--force", action="store_true", help="discard any existing file and partial download")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    directory = Path(args.dir).expanduser() if args.dir else data_dir()  # `--dir=~/x` reaches us as is
    path = ensure_model(OFFICIAL_FILES[args.model], directory, force=args.force)
    print(path)
    return 0


if __name__ == "__main__":
    from hymt.cli import run

    run(main)
