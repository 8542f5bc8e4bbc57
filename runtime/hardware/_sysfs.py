"""PCIe links and the cache disk, read from Linux sysfs.

Both sources take the sysfs root as an argument so tests can hand them a
recorded tree. On other systems (Windows, macOS, containers without /sys) they
report nothing (for the disk: its free space only) rather than fail: the policy
then falls back to cautious estimates.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Protocol

from ._profile import DiskInfo, DiskKind, PcieLink

# The first PCIe generation that runs at each transfer rate (GT/s).
_GT_TO_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
# PCI class codes: 0x03xxxx display controller, 0x1200xx processing accelerator.
_GPU_CLASSES = ("0x03", "0x1200")


class PcieSource(Protocol):
    """Lists the PCIe links of the machine's GPUs, in bus order.

    Contract: returns ``()`` when links cannot be read; never raises for a
    missing file.
    """

    def links(self) -> tuple[PcieLink, ...]: ...


class DiskSource(Protocol):
    """Describes the disk that holds ``path`` (which may not exist yet).

    Contract: free and total space always (from the nearest existing parent);
    ``kind`` is ``"unknown"`` when the device type cannot be told.
    """

    def disk(self, path: Path) -> DiskInfo: ...


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None


def parse_link_speed(text: str | None) -> int:
    """``"16.0 GT/s PCIe"`` -> 4; 0 when unknown."""
    if not text:
        return 0
    match = re.match(r"\s*([0-9.]+)\s*GT/s", text)
    if match is None:
        return 0
    return _GT_TO_GEN.get(float(match.group(1)), 0)


def _parse_width(text: str | None) -> int:
    try:
        return int(text or "")
    except ValueError:
        return 0


class SysfsPcieSource:
    """PCIe links of display and accelerator devices under ``/sys/bus/pci``."""

    def __init__(self, sys_root: Path = Path("/sys")) -> None:
        self._devices = sys_root / "bus" / "pci" / "devices"

    def links(self) -> tuple[PcieLink, ...]:
        if not self._devices.is_dir():
            return ()
        found = []
        for dev in sorted(self._devices.iterdir()):
            pci_class = _read(dev / "class") or ""
            if not pci_class.startswith(_GPU_CLASSES):
                continue
            gen_cur = parse_link_speed(_read(dev / "current_link_speed"))
            if gen_cur == 0:  # virtual or integrated devices have no link files
                continue
            found.append(
                PcieLink(
                    gen_current=gen_cur,
                    gen_max=parse_link_speed(_read(dev / "max_link_speed")) or gen_cur,
                    width_current=_parse_width(_read(dev / "current_link_width")),
                    width_max=_parse_width(_read(dev / "max_link_width")),
                )
            )
        return tuple(found)


def _existing_parent(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


class SysfsDiskSource:
    """Free space from ``statvfs``; NVMe, SSD or rotational from ``/sys/dev/block``."""

    def __init__(self, sys_root: Path = Path("/sys")) -> None:
        self._sys = sys_root

    def disk(self, path: Path) -> DiskInfo:
        where = _existing_parent(path)
        usage = shutil.disk_usage(where)
        if not hasattr(os, "major") or not (self._sys / "dev" / "block").is_dir():
            # Windows has no device numbers, macOS no sysfs: free space is still known
            return DiskInfo(str(path), usage.total, usage.free)
        st_dev = os.stat(where).st_dev
        device, kind = self._classify(os.major(st_dev), os.minor(st_dev))
        return DiskInfo(str(path), usage.total, usage.free, kind, device)

    def _classify(self, major: int, minor: int) -> tuple[str, DiskKind]:
        node = self._sys / "dev" / "block" / f"{major}:{minor}"
        try:
            block = node.resolve(strict=True)
        except OSError:  # overlay, tmpfs, btrfs subvolumes: no single block device
            return "", "unknown"
        return self._kind_of(block, depth=0)

    def _kind_of(self, block: Path, depth: int) -> tuple[str, DiskKind]:
        if (block / "partition").exists():
            block = block.parent
        slaves = sorted((block / "slaves").glob("*")) if (block / "slaves").is_dir() else []
        if slaves and depth < 4:  # device mapper (LVM, LUKS): classify what lies beneath
            return self._kind_of(slaves[0].resolve(), depth + 1)
        name = block.name
        if name.startswith("nvme"):
            return name, "nvme"
        if name.startswith(("vd", "xvd", "loop", "zram", "md")):
            # Virtual disks claim to be rotational by default; their real speed is unknown.
            return name, "unknown"
        rotational = _read(block / "queue" / "rotational")
        if rotational == "0":
            return name, "ssd"
        if rotational == "1":
            return name, "hdd"
        return name, "unknown"
