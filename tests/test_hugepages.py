"""Weights mapped in 2 MiB pages even when the page cache held the file in small folios."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import pytest

from hymt import hugepages
from hymt.gguf import GGUFFile, GGUFWriter

MIB = 1024 * 1024

needs_thp = pytest.mark.skipif(
    not hugepages.thp_enabled() or not hasattr(mmap, "MADV_HUGEPAGE") or not hasattr(os, "posix_fadvise"),
    reason="transparent huge pages are off or absent here",
)


def _plainly_mapped_huge_bytes(path: Path) -> int:
    """Touch every page of ``path`` through a fresh mapping without any advice; bytes in 2 MiB pages."""
    with open(path, "rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = np.frombuffer(mapping, np.uint8)
    int(view[::4096].sum())
    huge = hugepages.mapped_huge_bytes(path) or 0
    del view
    mapping.close()
    return huge


def _resident_bytes_of_mappings(path: Path, length: int) -> int:
    """Resident bytes (``Rss``) of this process's mappings of ``path`` that are ``length`` bytes long."""
    total, counting = 0, False
    target = os.path.realpath(path)
    with open("/proc/self/smaps", encoding="utf-8", errors="replace") as smaps:
        for line in smaps:
            fields = line.split(maxsplit=5)
            if fields and "-" in fields[0] and not fields[0].endswith(":"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                named = len(fields) == 6 and fields[5].rstrip("\n") == target
                counting = named and end - start >= length
            elif counting and fields and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


def _written_in_small_pages(tmp_path: Path, seed: int) -> tuple[Path, bytes, np.ndarray]:
    """A 16 MiB one-tensor GGUF written in 4 KiB pieces, which leaves its page cache in 4 KiB folios (skips
    where the kernel caches it in huge folios anyway); its path, bytes and the tensor [2048, 2048]."""
    writer = GGUFWriter(tmp_path / "written.gguf")
    weights = np.random.default_rng(seed).standard_normal((2048, 2048)).astype(np.float32)  # 16 MiB
    writer.add_tensor("w", [2048, 2048], "F32", weights)
    content = writer.write().read_bytes()
    path = tmp_path / "model.gguf"
    with open(path, "wb", buffering=0) as f:
        for start in range(0, len(content), 4096):
            f.write(content[start : start + 4096])
    if _plainly_mapped_huge_bytes(path) >= 2 * MIB:
        pytest.skip("this kernel cached a file written in 4 KiB pieces in huge folios anyway")
    return path, content, weights


@needs_thp
def test_a_model_cached_in_small_pages_is_mapped_in_huge_pages(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(hugepages, "MIN_FILE_BYTES", 4 * MIB)  # a small file stands in for a model
    path, _, weights = _written_in_small_pages(tmp_path, 0)

    with GGUFFile(path) as gguf:
        data = gguf.tensor("w").data
        assert np.array_equal(data.view(np.float32).reshape(2048, 2048), weights)  # read back intact
        assert gguf.huge_page_bytes() >= 12 * MIB  # of the 16 MiB, if this kernel can at all
        del data


@needs_thp
def test_only_the_regions_cached_in_small_pages_are_dropped(tmp_path: Path, monkeypatch) -> None:
    # A file cached in huge folios but for two regions that another reader faulted back in small ones (an
    # 18 GB model re-read whole for that would cost its next start a long prompt): only those two go. Neither
    # is a region a check of a few samples (first, last, evenly between) would have looked at.
    monkeypatch.setattr(hugepages, "MIN_FILE_BYTES", 4 * MIB)
    path, content, weights = _written_in_small_pages(tmp_path, 1)
    dropped: list[tuple[int, int]] = []
    drop = hugepages._drop_cached
    monkeypatch.setattr(
        hugepages,
        "_drop_cached",
        lambda m, fd, offset, length: (dropped.append((offset, length)), drop(m, fd, offset, length)),
    )
    with GGUFFile(path) as gguf:  # every region small: one probed, then the whole file is read back
        assert dropped == [(8 * MIB, 2 * MIB), (0, len(content))]
        assert gguf.huge_page_bytes() is not None
        int(gguf.tensor("w").data.view(np.uint8)[::4096].sum())
        if gguf.huge_page_bytes() < 12 * MIB:
            pytest.skip("this kernel does not read the file back in huge folios")
    dropped.clear()
    with GGUFFile(path) as gguf:  # all huge now: nothing to do
        assert dropped == []
    # 10 MiB .. 14 MiB (regions 5 and 6 of 8) written again in 4 KiB pieces
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fadvise(fd, 10 * MIB, 4 * MIB, os.POSIX_FADV_DONTNEED)
        for start in range(10 * MIB, 14 * MIB, 4096):
            os.pwrite(fd, content[start : start + 4096], start)
        os.fsync(fd)
    finally:
        os.close(fd)
    # The file's own mapping holds no pages while the regions are mapped one by one (a page mapped twice
    # counts twice in the resident size, which would peak near twice the file).
    resident: list[int] = []
    check = hugepages._huge_mapped
    monkeypatch.setattr(
        hugepages,
        "_huge_mapped",
        lambda fd, p, offsets: (
            resident.append(_resident_bytes_of_mappings(path, 16 * MIB)),
            check(fd, p, offsets),
        )[1],
    )
    with GGUFFile(path) as gguf:
        assert resident == [0, 0]  # the scan, then the probe
        assert dropped == [(12 * MIB, 2 * MIB), (10 * MIB, 2 * MIB)]  # the probe first
        data = gguf.tensor("w").data
        assert np.array_equal(data.view(np.float32).reshape(2048, 2048), weights)
        assert gguf.huge_page_bytes() >= 14 * MIB
        del data


def test_region_check_gives_up_where_it_cannot_tell(tmp_path: Path, monkeypatch) -> None:
    # A mapping the kernel did not align (a "huge page" of 2 MiB + 4 KiB stands in for it), or no smaps:
    # no verdict, no exception, and nothing dropped.
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(8 * MIB))
    fd = os.open(path, os.O_RDONLY)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(hugepages, "HUGE_PAGE_BYTES", 2 * MIB + 4096)
            assert hugepages._huge_mapped(fd, path, [0, 4 * MIB]) is None
        with monkeypatch.context() as patch:
            patch.setattr(hugepages, "_mapped_huge_bytes_by_address", lambda path: None)
            assert hugepages._huge_mapped(fd, path, [0]) is None
            patch.setattr(hugepages, "MIN_FILE_BYTES", 4 * MIB)
            patch.setattr(hugepages, "_drop_cached", lambda *args: pytest.fail("dropped without a verdict"))
            with open(path, "rb") as f:
                mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            assert hugepages.map_in_huge_pages(mapping, path) is False
            mapping.close()
        assert hugepages._huge_mapped(fd, path, []) == []
    finally:
        os.close(fd)
