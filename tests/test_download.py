"""The pinned, resumable, verified download (REFERENCE.md §10.4, §12.10) against a loopback HTTP server.

The server (``http.server`` in a thread) serves 65536 bytes of value 42 and records every request, so
tests can see the ``Range`` header, count requests, and misbehave on purpose. No test touches the internet.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import hymt
import hymt.download as dl
from hymt.errors import DownloadError

PAYLOAD = bytes([42]) * 65536
PAYLOAD_SHA256 = hashlib.sha256(PAYLOAD).hexdigest()
PATH = "/files/model.gguf"
PACKAGE_ROOT = str(Path(hymt.__file__).resolve().parents[1])


@dataclass
class Behaviour:
    honour_range: bool = True
    status: int | None = None  # answer every request with this status and no body
    drop_after: int | None = None  # the first full-body response stops after this many bytes
    bad_content_range: bool = False
    stall_after: int | None = None  # the first full-body response goes silent after this many bytes
    chunk_delay: float = 0.0  # seconds between 4 KiB pieces of every body (a slow link)
    requests: list[dict[str, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)


class Handler(BaseHTTPRequestHandler):
    behaviour: Behaviour

    def log_message(self, *args) -> None:  # keep test output quiet
        pass

    def do_GET(self) -> None:
        b = self.server.behaviour  # type: ignore[attr-defined]
        b.requests.append(dict(self.headers))
        b.paths.append(self.path)
        if self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", PATH)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if b.status is not None:
            self.send_response(b.status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start = 0
        range_header = self.headers.get("Range")
        if range_header and b.honour_range:
            start = int(range_header.removeprefix("bytes=").rstrip("-"))
            if start >= len(PAYLOAD):
                self.send_response(416)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            first = start + 1 if b.bad_content_range else start
            self.send_header("Content-Range", f"bytes {first}-{len(PAYLOAD) - 1}/{len(PAYLOAD)}")
        else:
            self.send_response(200)
        body = PAYLOAD[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if b.stall_after is not None:
            head, b.stall_after = body[: b.stall_after], None
            self.wfile.write(head)
            self.wfile.flush()
            time.sleep(1.0)
            self.close_connection = True
            return
        if b.drop_after is not None:
            body, b.drop_after = body[: b.drop_after], None
            self.wfile.write(body)
            self.wfile.flush()
            self.close_connection = True
            return
        if b.chunk_delay:
            for start in range(0, len(body), 4096):
                self.wfile.write(body[start : start + 4096])
                self.wfile.flush()
                time.sleep(b.chunk_delay)
            return
        self.wfile.write(body)


@pytest.fixture
def server() -> Iterator[tuple[str, Behaviour]]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True  # a stalled handler must not hold up the test's teardown
    httpd.behaviour = Behaviour()  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", httpd.behaviour  # type: ignore[attr-defined]
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(dl, "RETRY_BACKOFF_SECONDS", 0.0)


def fetch(base: str, dest: Path, sha256: str = PAYLOAD_SHA256, **kwargs) -> Path:
    return dl.download_file(f"{base}{PATH}", dest, sha256, len(PAYLOAD), progress=False, **kwargs)


# -- names and URLs -------------------------------------------------------------------------------------


def test_default_paths_and_urls(monkeypatch):
    assert dl.default_model_path("data") == Path("data/Hy-MT2-1.8B-1.25Bit.gguf")
    assert dl.default_model_path("/srv/models") == Path("/srv/models/Hy-MT2-1.8B-1.25Bit.gguf")
    url = dl.DEFAULT_MODEL.url()
    assert url == (
        "https://huggingface.co/tencent/Hy-MT2-1.8B-1.25Bit-GGUF/resolve/9df5c824a00a744fb0512a29c640466f4d97dfb0/"
        "Hy-MT2-1.8B-1.25Bit.gguf?download=true"
    )
    assert url.startswith("https://huggingface.co/") and url.endswith(
        "Hy-MT2-1.8B-1.25Bit.gguf?download=true"
    )
    assert dl.DEFAULT_MODEL.size == 461860800
    assert dl.DEFAULT_MODEL.sha256 == "cc497fe8f033b52b3b8b00a7669e9661435432f9d4cd43f7ed24400c01507a93"
    for endpoint in ("https://hf-mirror.com", "https://hf-mirror.com/", "https://hf-mirror.com//"):
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        assert dl.DEFAULT_MODEL.url().startswith(
            "https://hf-mirror.com/tencent/Hy-MT2-1.8B-1.25Bit-GGUF/resolve/"
        )
    assert hashlib.sha256(b"hello world").hexdigest() == (
        "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"
    )


def test_official_table():
    assert set(dl.OFFICIAL_FILES) == {
        "stq", "q2c", "1.8b-q4_k_m", "1.8b-q6_k", "1.8b-q8_0",
        "7b-q4_k_m", "7b-q6_k", "7b-q8_0", "30b-q4_k_m", "30b-q8_0",
    }  # fmt: skip
    q2c = dl.OFFICIAL_FILES["q2c"]
    assert (q2c.repo, q2c.filename, q2c.size) == (
        "tencent/Hy-MT2-1.8B-2Bit-GGUF",
        "Hy-MT2-1.8B-2Bit.gguf",
        600534880,
    )
    assert dl.OFFICIAL_FILES["7b-q6_k"].filename == "HY-MT2-7B-Q6_K.gguf"
    for f in dl.OFFICIAL_FILES.values():
        assert len(f.sha256) == 64 and len(f.revision) == 40 and f.size > 0


# -- §12.10 scenarios -----------------------------------------------------------------------------------


def test_initial_download_then_cached_reuse(server, tmp_path, capsys):
    base, behaviour = server
    dest = tmp_path / "data" / "model.gguf"
    assert fetch(base, dest) == dest
    assert dest.read_bytes() == PAYLOAD and not dest.with_name("model.gguf.part").exists()
    assert len(behaviour.requests) == 1 and "Range" not in behaviour.requests[0]
    assert f"Successfully downloaded and verified {dest}" in capsys.readouterr().err
    assert fetch(base, dest) == dest
    assert len(behaviour.requests) == 1  # reused without any request
    err = capsys.readouterr().err
    assert f"Verifying existing model at {dest}" in err and f"Model at {dest} verified successfully" in err


def test_bad_checksum_leaves_nothing(server, tmp_path):
    base, _ = server
    dest = tmp_path / "model.gguf"
    wrong = "0" * 64
    with pytest.raises(DownloadError) as info:
        fetch(base, dest, sha256=wrong)
    assert (
        str(info.value) == f"Checksum mismatch for downloaded model: expected {wrong}, got {PAYLOAD_SHA256}"
    )
    assert list(tmp_path.glob("model.gguf*")) == []


def test_checksums_compare_case_insensitively(server, tmp_path):
    base, _ = server
    assert fetch(base, tmp_path / "model.gguf", sha256=PAYLOAD_SHA256.upper()).read_bytes() == PAYLOAD


@pytest.mark.parametrize("corruption", ["same size", "wrong size"])
def test_corrupt_existing_file_is_downloaded_again(server, tmp_path, capsys, corruption):
    base, behaviour = server
    dest = tmp_path / "model.gguf"
    dest.write_bytes(bytes(len(PAYLOAD)) if corruption == "same size" else PAYLOAD[:100])
    fetch(base, dest)
    assert dest.read_bytes() == PAYLOAD and len(behaviour.requests) == 1
    err = capsys.readouterr().err
    if corruption == "same size":
        assert f"Checksum mismatch for {dest}; re-downloading..." in err
    else:
        assert f"Existing file at {dest} has incorrect size; re-downloading..." in err


def test_corrupting_a_verified_file_is_noticed(server, tmp_path):
    base, behaviour = server
    dest = fetch(base, tmp_path / "model.gguf")  # its digest is now cached
    dest.write_bytes(b"\x00" + PAYLOAD[1:])
    fetch(base, dest)
    assert dest.read_bytes() == PAYLOAD and len(behaviour.requests) == 2


def test_resume_with_range(server, tmp_path):
    base, behaviour = server
    dest = tmp_path / "model.gguf"
    dest.with_name("model.gguf.part").write_bytes(PAYLOAD[:1000])
    fetch(base, dest)
    assert behaviour.requests[0]["Range"] == "bytes=1000-"
    assert dest.read_bytes() == PAYLOAD


def test_server_ignoring_range_restarts_from_zero(server, tmp_path):
    base, behaviour = server
    behaviour.honour_range = False
    dest = tmp_path / "model.gguf"
    dest.with_name("model.gguf.part").write_bytes(b"\x07" * 1000)  # wrong bytes: only a restart can verify
    fetch(base, dest)
    assert behaviour.requests[0]["Range"] == "bytes=1000-" and len(behaviour.requests) == 1
    assert dest.read_bytes() == PAYLOAD


def test_mismatched_content_range_restarts_from_zero(server, tmp_path):
    base, behaviour = server
    behaviour.bad_content_range = True
    dest = tmp_path / "model.gguf"
    dest.with_name("model.gguf.part").write_bytes(PAYLOAD[:1000])
    fetch(base, dest)
    assert [r.get("Range") for r in behaviour.requests] == ["bytes=1000-", None]
    assert dest.read_bytes() == PAYLOAD


@pytest.mark.parametrize("part_bytes", [len(PAYLOAD), len(PAYLOAD) + 10])
def test_part_not_smaller_than_expected_restarts(server, tmp_path, part_bytes):
    base, behaviour = server
    dest = tmp_path / "model.gguf"
    dest.with_name("model.gguf.part").write_bytes(b"\x01" * part_bytes)
    fetch(base, dest)
    assert [r.get("Range") for r in behaviour.requests] == [None]
    assert dest.read_bytes() == PAYLOAD


def test_416_restarts_from_zero(server, tmp_path, monkeypatch):
    base, behaviour = server
    dest = tmp_path / "model.gguf"
    # Expect one byte more than the server has, so the .part (the whole payload) asks past the end.
    dest.with_name("model.gguf.part").write_bytes(PAYLOAD)
    with pytest.raises(DownloadError):
        dl.download_file(f"{base}{PATH}", dest, PAYLOAD_SHA256, len(PAYLOAD) + 1, progress=False, retries=0)
    assert [r.get("Range") for r in behaviour.requests][:2] == [f"bytes={len(PAYLOAD)}-", None]


def test_redirect_is_followed(server, tmp_path):
    base, behaviour = server
    dest = tmp_path / "model.gguf"
    dl.download_file(f"{base}/redirect", dest, PAYLOAD_SHA256, len(PAYLOAD), progress=False)
    assert behaviour.paths == ["/redirect", PATH] and dest.read_bytes() == PAYLOAD


def test_dropped_connection_is_resumed_by_a_second_call(server, tmp_path, monkeypatch):
    base, behaviour = server
    monkeypatch.setattr(dl, "CHUNK_BYTES", 1024)  # what was read before the drop reaches the .part
    behaviour.drop_after = 30000
    dest = tmp_path / "model.gguf"
    part = dest.with_name("model.gguf.part")
    with pytest.raises(DownloadError, match="run again to resume"):
        fetch(base, dest, retries=0)
    kept = part.read_bytes()
    assert 0 < len(kept) <= 30000 and kept == PAYLOAD[: len(kept)] and not dest.exists()
    fetch(base, dest)
    assert behaviour.requests[-1]["Range"] == f"bytes={len(kept)}-"
    assert dest.read_bytes() == PAYLOAD and not part.exists()


def test_dropped_connection_is_retried_within_one_call(server, tmp_path, monkeypatch):
    base, behaviour = server
    monkeypatch.setattr(dl, "CHUNK_BYTES", 1024)
    behaviour.drop_after = 12345
    dest = fetch(base, tmp_path / "model.gguf", retries=2)
    ranges = [r.get("Range") for r in behaviour.requests]
    assert (
        len(ranges) == 2 and ranges[0] is None and ranges[1].startswith("bytes=") and ranges[1] != "bytes=0-"
    )
    assert dest.read_bytes() == PAYLOAD


def test_stalled_transfer_times_out_and_resumes(server, tmp_path, monkeypatch):
    base, behaviour = server
    monkeypatch.setattr(dl, "CHUNK_BYTES", 1024)
    behaviour.stall_after = 20000
    dest = fetch(base, tmp_path / "model.gguf", retries=1, read_timeout=0.2)
    ranges = [r.get("Range") for r in behaviour.requests]
    assert len(ranges) == 2 and ranges[0] is None and ranges[1].startswith("bytes=")
    assert dest.read_bytes() == PAYLOAD


@pytest.mark.parametrize("status", [404, 403, 500, 503])
def test_http_errors(server, tmp_path, status):
    base, behaviour = server
    behaviour.status = status
    dest = tmp_path / "model.gguf"
    dest.with_name("model.gguf.part").write_bytes(PAYLOAD[:10])
    with pytest.raises(DownloadError) as info:
        fetch(base, dest, retries=2)
    assert str(info.value) == f"Failed to download model from {base}{PATH}: HTTP {status}"
    assert len(behaviour.requests) == (3 if status >= 500 else 1)  # only transient statuses are retried
    assert dest.with_name("model.gguf.part").read_bytes() == PAYLOAD[:10]  # kept for the next resume


def test_force_discards_file_and_part(server, tmp_path):
    base, behaviour = server
    dest = fetch(base, tmp_path / "model.gguf")
    dest.with_name("model.gguf.part").write_bytes(PAYLOAD[:5])
    fetch(base, dest, force=True)
    assert [r.get("Range") for r in behaviour.requests] == [None, None]
    assert dest.read_bytes() == PAYLOAD


def test_destination_that_is_a_directory_fails_before_any_request(server, tmp_path):
    """A folder where the model file should go would only fail at the final rename, after the whole
    download; a --dir that is a file failed with a bare 'File exists'."""
    base, behaviour = server
    (tmp_path / "model.gguf").mkdir()
    with pytest.raises(DownloadError, match=r"^.*model\.gguf is a directory, not a model file"):
        fetch(base, tmp_path / "model.gguf")
    (tmp_path / "not-a-dir").write_bytes(b"x")
    with pytest.raises(DownloadError, match=r"^download folder .*not-a-dir is not a directory"):
        fetch(base, tmp_path / "not-a-dir" / "model.gguf")
    assert behaviour.requests == []


def test_two_processes_downloading_the_same_file_share_one_transfer(server, tmp_path):
    """Two programs ensuring the same model at once (a service and a manual run) used to write into the
    same .part — one from zero, the other resuming at the first one's size — and both ended in a checksum
    mismatch after the whole transfer. The second now waits for the first and reuses its verified file."""
    base, behaviour = server
    behaviour.chunk_delay = 0.02  # 16 pieces: about a third of a second per transfer
    dest = tmp_path / "model.gguf"
    script = (
        "import sys, hymt.download as dl; "
        "dl.download_file(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), progress=False)"
    )
    command = [sys.executable, "-c", script, f"{base}{PATH}", str(dest), PAYLOAD_SHA256, str(len(PAYLOAD))]
    environment = {**os.environ, "PYTHONPATH": PACKAGE_ROOT}
    first = subprocess.Popen(command, env=environment, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 10
    while not behaviour.requests and time.monotonic() < deadline:
        time.sleep(0.01)  # the first transfer has begun
    second = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=60)
    _, first_err = first.communicate(timeout=60)
    assert first.returncode == 0, first_err
    assert second.returncode == 0, second.stderr
    assert dest.read_bytes() == PAYLOAD
    assert len(behaviour.requests) == 1  # the second found the verified file
    assert "Waiting for another download" in second.stderr


def test_not_enough_disk_space(server, tmp_path, monkeypatch):
    base, _ = server

    class Usage:
        free = 1000

    monkeypatch.setattr(dl.shutil, "disk_usage", lambda path: Usage)
    with pytest.raises(
        DownloadError, match=r"^Not enough disk space in .*: the download needs 65536 more bytes"
    ):
        fetch(base, tmp_path / "model.gguf")
    assert not (tmp_path / "model.gguf").exists() and not (tmp_path / "model.gguf.part").exists()


def test_hf_token_is_sent_as_bearer(server, tmp_path, monkeypatch):
    base, behaviour = server
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    fetch(base, tmp_path / "model.gguf")
    assert behaviour.requests[0]["Authorization"] == "Bearer hf_secret"


# -- the default model ----------------------------------------------------------------------------------


@pytest.fixture
def small_default(monkeypatch):
    """The default model's repo, revision and file name, pinned to the mock payload."""
    model = dl.ModelFile(
        "stq",
        dl.DEFAULT_MODEL.repo,
        dl.DEFAULT_MODEL.revision,
        dl.DEFAULT_MODEL.filename,
        len(PAYLOAD),
        PAYLOAD_SHA256,
    )
    monkeypatch.setattr(dl, "DEFAULT_MODEL", model)
    monkeypatch.setitem(dl.OFFICIAL_FILES, "stq", model)
    return model


def test_ensure_default_model_through_hf_endpoint(server, tmp_path, monkeypatch, small_default):
    base, behaviour = server
    monkeypatch.setenv("HF_ENDPOINT", base + "/")
    path = dl.ensure_default_model(tmp_path / "data")
    assert path == tmp_path / "data" / "Hy-MT2-1.8B-1.25Bit.gguf" and path.read_bytes() == PAYLOAD
    assert behaviour.paths == [
        f"/tencent/Hy-MT2-1.8B-1.25Bit-GGUF/resolve/{small_default.revision}/Hy-MT2-1.8B-1.25Bit.gguf?download=true"
    ]
    assert dl.ensure_default_model(tmp_path / "data") == path and len(behaviour.requests) == 1


def test_unreachable_network_names_the_way_out(tmp_path, monkeypatch, small_default):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(DownloadError) as info:
        dl.ensure_default_model(tmp_path)
    message = str(info.value)
    assert "network unreachable" in message and "--model" in message and "HF_ENDPOINT" in message


def run_program(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = "from hymt.cli import run; from hymt.download import main; run(main)"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=PACKAGE_ROOT, **env),
        timeout=120,
    )


def test_program_help_version_and_errors(tmp_path, server):
    base, behaviour = server
    result = run_program("--help", env={})
    assert result.returncode == 0 and "Download the default Hy-MT2-1.8B 1.25Bit model" in result.stdout
    assert "--force" in result.stdout and "--dir" in result.stdout
    result = run_program("--version", env={})
    assert result.returncode == 0 and result.stdout.strip() == f"hymt-download {hymt.__version__}"
    result = run_program("--model", "nope", env={})
    assert result.returncode == 2 and "error: argument --model" in result.stderr
    behaviour.status = 404
    result = run_program(
        "--dir", str(tmp_path / "d"), env={"HF_ENDPOINT": base, "XDG_CACHE_HOME": str(tmp_path)}
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: Failed to download model from {dl.OFFICIAL_FILES['stq'].url(base)}: HTTP 404"
    )


def test_program_downloads_into_dir(tmp_path, server, monkeypatch):
    base, _ = server
    model = dl.ModelFile("stq", "tencent/x", "0" * 40, "x.gguf", len(PAYLOAD), PAYLOAD_SHA256)
    monkeypatch.setitem(dl.OFFICIAL_FILES, "stq", model)
    monkeypatch.setattr(
        dl,
        "ensure_model",
        lambda m, d, force=False: dl.download_file(
            f"{base}{PATH}", Path(d) / m.filename, m.sha256, m.size, force=force, progress=False
        ),
    )
    monkeypatch.setenv("HYMT_DATA_DIR", str(tmp_path / "env-dir"))
    assert dl.main([]) == 0
    assert (tmp_path / "env-dir" / "x.gguf").read_bytes() == PAYLOAD
    assert dl.main(["--dir", str(tmp_path / "flag-dir"), "--force"]) == 0
    assert (tmp_path / "flag-dir" / "x.gguf").read_bytes() == PAYLOAD
    monkeypatch.setenv("HOME", str(tmp_path))  # `--dir=~/x` is not expanded by the shell
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # where a literal `~` folder would appear
    assert dl.main(["--dir=~/tilde-dir"]) == 0
    assert (tmp_path / "tilde-dir" / "x.gguf").read_bytes() == PAYLOAD
    assert list((tmp_path / "cwd").iterdir()) == []
