"""The probe and its sources, on recorded machines and recorded sysfs trees."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest
import warmstart.runtime.hardware as hardware
from warmstart.runtime.hardware import (
    DiskInfo,
    FirstGpuSource,
    GpuInfo,
    GpuSource,
    HardwareProfile,
    MemoryInfo,
    NoGpuSource,
    NvmlGpuSource,
    PcieLink,
    RecordedGpuSource,
    RecordedPcieSource,
    SysfsDiskSource,
    SysfsPcieSource,
    TorchGpuSource,
    probe,
    recorded_sources,
)
from warmstart.runtime.hardware._host import backend_from_libs, parse_cpuinfo
from warmstart.runtime.hardware._sysfs import parse_link_speed

from tests.hardware.machines import MACHINES, RTX4090


def test_all_is_true() -> None:
    public = {n for n in dir(hardware) if not n.startswith("_") and n != "annotations"}
    assert sorted(hardware.__all__) == sorted(public)


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_probe_replays_a_recorded_machine(machine: str, tmp_path: Path) -> None:
    profile = MACHINES[machine]
    again = probe(Path(profile.disk.path), recorded_sources(profile))
    assert again == profile and again.machine_id() == profile.machine_id()


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_profile_json_round_trip(machine: str) -> None:
    profile = MACHINES[machine]
    data = json.loads(json.dumps(profile.to_dict()))
    assert HardwareProfile.from_dict(data) == profile
    assert data["machine_id"] == profile.machine_id()


def test_machine_id_ignores_what_moves_and_sees_what_does_not() -> None:
    busier = replace(RTX4090, memory=replace(RTX4090.memory, available=1 << 30))
    assert busier.machine_id() == RTX4090.machine_id()
    other_gpu = replace(RTX4090, gpus=(replace(RTX4090.gpus[0], name="NVIDIA RTX A6000"),))
    assert other_gpu.machine_id() != RTX4090.machine_id()


@pytest.mark.parametrize(
    ("link", "gbps"),
    [
        (PcieLink(4, 4, 16, 16), 31.5),
        (PcieLink(1, 4, 16, 16), 31.5),  # idle GPU: the link trains back up under load
        (PcieLink(3, 3, 8, 16), 7.88),  # x16 card in an x8 slot
        (PcieLink(5, 5, 16, 16), 63.0),
        (PcieLink(0, 0, 0, 0), 0.0),
    ],
)
def test_link_bandwidth(link: PcieLink, gbps: float) -> None:
    assert link.gbps == pytest.approx(gbps, rel=0.01)


def test_no_gpu_is_a_normal_profile(tmp_path: Path) -> None:
    profile = MACHINES["laptop"]
    sources = replace(recorded_sources(profile), gpu=NoGpuSource())
    found = probe(tmp_path, sources)
    assert found.gpus == () and found.gpu is None and not found.offloads and found.notes == ()


class _Broken:
    name = "broken"

    def gpus(self) -> tuple[GpuInfo, ...]:
        raise RuntimeError("driver/library version mismatch")


def test_a_failing_source_leaves_a_note_not_a_crash(tmp_path: Path) -> None:
    sources = replace(recorded_sources(RTX4090), gpu=_Broken())
    found = probe(tmp_path, sources)
    assert found.gpus == () and "version mismatch" in found.notes[0]


def test_sysfs_links_fill_gpus_without_one(tmp_path: Path) -> None:
    gpu = GpuInfo("NVIDIA GeForce RTX 4090", 24 << 30, 23 << 30, None, "torch")
    link = PcieLink(4, 4, 16, 16)
    sources = replace(
        recorded_sources(RTX4090), gpu=RecordedGpuSource((gpu,)), pcie=RecordedPcieSource((link,))
    )
    assert probe(tmp_path, sources).gpus[0].pcie == link


def test_probe_on_this_machine(tmp_path: Path) -> None:
    found = probe(tmp_path / "not" / "yet")
    assert found.memory.total > 0 and found.cpu.logical_cores >= 1
    assert found.disk.free > 0 and found.disk.path.endswith("yet")


# --- GPU sources: one contract, fed by fake libraries ---------------------------------


class _FakeNvmlError(Exception):
    pass


def _fake_pynvml(count: int, link_error: bool = False) -> types.ModuleType:
    mod = types.ModuleType("pynvml")
    mem = types.SimpleNamespace(total=24 << 30, free=20 << 30)

    def link(value: int):  # type: ignore[no-untyped-def]
        def read(handle: int) -> int:
            if link_error:
                raise _FakeNvmlError("not supported")
            return value

        return read

    mod.__dict__.update(
        NVMLError=_FakeNvmlError,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA GeForce RTX 4090",
        nvmlDeviceGetMemoryInfo=lambda h: mem,
        nvmlDeviceGetCurrPcieLinkGeneration=link(1),
        nvmlDeviceGetMaxPcieLinkGeneration=link(4),
        nvmlDeviceGetCurrPcieLinkWidth=link(16),
        nvmlDeviceGetMaxPcieLinkWidth=link(16),
    )
    return mod


def _fake_torch(count: int) -> types.ModuleType:
    mod = types.ModuleType("torch")
    mod.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        is_available=lambda: count > 0,
        device_count=lambda: count,
        mem_get_info=lambda i: (20 << 30, 24 << 30),
        get_device_properties=lambda i: types.SimpleNamespace(name="NVIDIA GeForce RTX 4090"),
    )
    return mod


@pytest.mark.parametrize("count", [0, 1, 2])
@pytest.mark.parametrize("kind", ["nvml", "torch", "first", "none"])
def test_gpu_source_contract(kind: str, count: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(count))
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(count))
    sources: dict[str, GpuSource] = {
        "nvml": NvmlGpuSource(),
        "torch": TorchGpuSource(),
        "first": FirstGpuSource(NoGpuSource(), TorchGpuSource()),
        "none": NoGpuSource(),
    }
    source = sources[kind]
    found = source.gpus()
    assert isinstance(found, tuple) and all(isinstance(g, GpuInfo) for g in found)
    assert len(found) == (0 if kind == "none" else count)
    for gpu in found:
        assert gpu.name == "NVIDIA GeForce RTX 4090" and 0 < gpu.vram_free <= gpu.vram_total
    if kind == "nvml" and found:
        assert found[0].pcie == PcieLink(1, 4, 16, 16)


def test_nvml_without_a_link_reports_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(1, link_error=True))
    assert NvmlGpuSource().gpus()[0].pcie is None


@pytest.mark.parametrize("module", ["pynvml", "torch"])
def test_missing_library_means_no_gpu(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # makes the import raise ImportError
    source = NvmlGpuSource() if module == "pynvml" else TorchGpuSource()
    assert source.gpus() == ()


# --- sysfs, /proc/cpuinfo and the llama.cpp build -----------------------------------


@pytest.mark.parametrize(
    ("text", "gen"),
    [("2.5 GT/s PCIe", 1), ("8.0 GT/s PCIe", 3), ("16.0 GT/s PCIe", 4), ("32.0 GT/s", 5),
     ("Unknown", 0), ("", 0), (None, 0)],
)  # fmt: skip
def test_parse_link_speed(text: str | None, gen: int) -> None:
    assert parse_link_speed(text) == gen


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")


def test_sysfs_pcie_lists_gpu_links_only(tmp_path: Path) -> None:
    dev = "bus/pci/devices"
    _write(tmp_path, {
        f"{dev}/0000:01:00.0/class": "0x030000",
        f"{dev}/0000:01:00.0/current_link_speed": "2.5 GT/s PCIe",
        f"{dev}/0000:01:00.0/max_link_speed": "16.0 GT/s PCIe",
        f"{dev}/0000:01:00.0/current_link_width": "16",
        f"{dev}/0000:01:00.0/max_link_width": "16",
        f"{dev}/0000:02:00.0/class": "0x010802",  # an NVMe controller
        f"{dev}/0000:02:00.0/current_link_speed": "16.0 GT/s PCIe",
        f"{dev}/0000:00:02.0/class": "0x030000",  # integrated graphics: no link files
    })  # fmt: skip
    assert SysfsPcieSource(tmp_path).links() == (PcieLink(1, 4, 16, 16),)
    assert SysfsPcieSource(tmp_path / "absent").links() == ()


def _block(root: Path, name: str, rotational: str | None = None) -> Path:
    path = root / "devices" / name
    path.mkdir(parents=True)
    if rotational is not None:
        _write(path, {"queue/rotational": rotational})
    return path


@pytest.mark.parametrize(
    ("name", "rotational", "partition", "kind"),
    [
        ("nvme0n1", "0", True, "nvme"),
        ("sda", "0", True, "ssd"),
        ("sdb", "1", False, "hdd"),
        ("vda", "1", True, "unknown"),  # virtio claims to be rotational
        ("sdc", None, False, "unknown"),
    ],
)
def test_disk_kind(
    name: str, rotational: str | None, partition: bool, kind: str, tmp_path: Path
) -> None:
    disk = _block(tmp_path, name, rotational)
    node = disk
    if partition:
        node = disk / f"{name}p1"
        _write(node, {"partition": "1"})
    (tmp_path / "dev" / "block").mkdir(parents=True)
    (tmp_path / "dev" / "block" / "259:1").symlink_to(node)
    assert SysfsDiskSource(tmp_path)._classify(259, 1) == (name, kind)


def test_disk_kind_looks_beneath_device_mapper(tmp_path: Path) -> None:
    nvme = _block(tmp_path, "nvme0n1", "0")
    part = nvme / "nvme0n1p3"
    _write(part, {"partition": "3"})
    dm = _block(tmp_path, "dm-0", "0")
    (dm / "slaves").mkdir()
    (dm / "slaves" / "nvme0n1p3").symlink_to(part)
    (tmp_path / "dev" / "block").mkdir(parents=True)
    (tmp_path / "dev" / "block" / "253:0").symlink_to(dm)
    assert SysfsDiskSource(tmp_path)._classify(253, 0) == ("nvme0n1", "nvme")
    assert SysfsDiskSource(tmp_path)._classify(0, 42) == ("", "unknown")  # overlay, tmpfs


def test_disk_space_of_a_path_not_made_yet(tmp_path: Path) -> None:
    info = SysfsDiskSource().disk(tmp_path / "a" / "b")
    assert isinstance(info, DiskInfo) and 0 < info.free <= info.total


@pytest.mark.parametrize(
    ("text", "model", "flags"),
    [
        ("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse4_2 avx avx2 fma xsave\n",
         "AMD EPYC 7B13", ("avx", "avx2", "fma", "sse4_2")),
        ("processor\t: 0\nFeatures\t: fp asimd evtstrm aes asimddp\nCPU part\t: 0xd0c\n",
         "", ("asimd", "asimddp")),
        ("", "", ()),
    ],
)  # fmt: skip
def test_parse_cpuinfo(text: str, model: str, flags: tuple[str, ...]) -> None:
    assert parse_cpuinfo(text) == (model, flags)


@pytest.mark.parametrize(
    ("libs", "system", "machine", "backend"),
    [
        (["libllama.so", "libggml-cuda.so", "libggml-cpu.so"], "Linux", "x86_64", "cuda"),
        (["libllama.so", "libggml-vulkan.so"], "Linux", "x86_64", "vulkan"),
        (["libllama.dylib", "libggml-metal.dylib"], "Darwin", "arm64", "metal"),
        (["libllama.dylib"], "Darwin", "arm64", "metal"),
        (["libllama.so", "libggml-cpu.so"], "Linux", "x86_64", "cpu"),
        (["llama.dll", "ggml-cuda.dll"], "Windows", "AMD64", "cuda"),
    ],
)
def test_backend_from_libs(libs: list[str], system: str, machine: str, backend: str) -> None:
    assert backend_from_libs(libs, system, machine) == backend


def test_memory_of_this_machine() -> None:
    mem = hardware.PsutilMemorySource().memory()
    assert isinstance(mem, MemoryInfo) and 0 < mem.available <= mem.total
