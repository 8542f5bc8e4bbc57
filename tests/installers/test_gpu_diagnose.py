"""The load diagnosis (installers/gpu/diagnose.py) on the CPU build: every case runs in a
child and is recorded, the report is on disk after each case, a field this
llama-cpp-python lacks is "n/a", and the outcomes are read back as conclusions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from installers.gpu import diagnose, synth_gguf

CASE_KEYS = {"case", "why", "outcome", "returncode", "signal", "seconds", "reached", "log_tail",
             "python_fault", "key_line", "libraries", "n_gpu_layers", "params", "env", "decode",
             "model"}  # fmt: skip


@pytest.mark.slow
def test_every_case_runs_in_its_own_child_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = diagnose.main(["--out", str(out), "--work", str(tmp_path / "w"), "--big", "tiny"])
    report = json.loads((out / "diagnosis.json").read_text())
    assert code == 0 and report["big_geometry"] == "tiny"
    assert [c["case"] for c in report["cases"]] == [c.name for c in diagnose.CASES]
    by_name = {c["case"]: c for c in report["cases"]}
    for case in report["cases"]:
        assert set(case) >= CASE_KEYS, case["case"]
        assert case["outcome"] == "ok" or case["outcome"].startswith(("died by", "exit")), case
    # the plain loads live on the CPU build, each in a child that saw llama.cpp's libraries
    lives = ("tiny_gpu_all", "big_gpu_all", "big_gpu_0", "big_gpu_all_no_mmap",
             "big_no_cuda_devices", "big_cpu_decode16_extra_off", "big_vocab_only")  # fmt: skip
    for name in lives:
        assert by_name[name]["outcome"] == "ok" and by_name[name]["reached"] == "done", name
    assert any("libllama" in lib for lib in by_name["big_gpu_all"]["libraries"])
    assert by_name["big_gpu_all_no_pinned"]["env"] == {"GGML_CUDA_NO_PINNED": "1"}
    env = report["environment"]
    assert {"uname_r", "LD_LIBRARY_PATH", "ldd", "library_dirs", "cuda_gdb"} <= set(env)
    assert "load_mode" in env["model_params_fields"] and "libllama.so" in env["ldd"]
    # a death by a signal gets a backtrace, or says why not
    for case in report["cases"]:
        if case["signal"]:
            assert case["backtrace"].get("skipped") or case["backtrace"]["tail"]
    table = (out / "diagnosis.md").read_text()
    assert all(f"| {c.name} |" in table for c in diagnose.CASES)


def test_a_timeout_is_recorded_and_the_report_is_written_after_each_case(tmp_path: Path) -> None:
    out = tmp_path / "out"
    diagnose.main(["--out", str(out), "--work", str(tmp_path / "w"), "--big", "tiny",
                   "--timeout-s", "0.05", "--cases", "big_gpu_all", "big_gpu_0"])  # fmt: skip
    report = json.loads((out / "diagnosis.json").read_text())
    assert [c["outcome"] for c in report["cases"]] == ["timeout (0 s)"] * 2
    assert (
        report["cases"][0]["returncode"] is None and "timeout" in (out / "diagnosis.md").read_text()
    )


def test_a_missing_field_is_n_a_and_runs_no_child(tmp_path: Path) -> None:
    model = synth_gguf.write(tmp_path / "t.gguf", synth_gguf.GEOMETRIES["tiny"])
    case = next(c for c in diagnose.CASES if c.name == "big_no_alloc")
    fields = ["n_gpu_layers", "vocab_only"]  # as an older llama-cpp-python would have
    result = diagnose.run_case(case, model, tmp_path, 60.0, fields)
    assert result["outcome"] == "n/a" and "no_alloc" in result["note"]
    assert not (tmp_path / "children").exists()


def test_the_log_is_split_from_pythons_fault_report() -> None:
    text = "load_tensors: CUDA0 model buffer\nggml_cuda_init: found 1 device\n"
    text += (
        "Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call first):\n"
    )
    parts = diagnose.split_log(text)
    assert parts["log_tail"] == [
        "load_tensors: CUDA0 model buffer",
        "ggml_cuda_init: found 1 device",
    ]
    assert parts["python_fault"][0] == "Fatal Python error: Segmentation fault"
    assert parts["key_line"] == "ggml_cuda_init: found 1 device"
    failed = diagnose.split_log("a\nsrc/llama.cpp:1: GGML_ASSERT(x) failed\nb\n")
    assert failed["key_line"] == "src/llama.cpp:1: GGML_ASSERT(x) failed"


def _case(name: str, ok: bool) -> dict[str, str]:
    return {"case": name, "outcome": "ok" if ok else "died by SIGSEGV"}


def test_the_conclusions_follow_the_outcomes() -> None:
    as_on_the_h200 = [
        _case("big_vocab_only", True),
        _case("big_gpu_0", True),
        _case("big_gpu_all", False),
        _case("big_gpu_all_no_mmap", True),
        _case("big_no_cuda_devices", True),
        _case("tiny_gpu_all", True),
        {"case": "big_no_alloc", "outcome": "n/a"},
    ]
    said = " / ".join(diagnose.conclude(as_on_the_h200))
    assert "a GPU path of the loader" in said and "mmap is the path that kills" in said
    assert "size-dependent" in said and "CUDA (or the sandbox under it)" in said
    assert diagnose.conclude([_case("big_gpu_all", True)]) == ["every case lived"]
    amx = diagnose.conclude(
        [_case("big_cpu_decode16_extra_off", True), _case("big_cpu_decode16_extra_on", False)]
    )
    assert any("AMX" in s for s in amx)
