"""The CUDA wheel carried to the GPU machine (installers/gpu/slim_wheel.py): each library
once, under the names llama_cpp opens and the sonames the libraries ask for, and a
RECORD that matches what is left, so pip installs it as it would the original."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

from installers.gpu import slim_wheel

INFO = "llama_cpp_python-0.3.36.dist-info/"
LIBS = tuple(
    f"lib{name}.so{tail}"
    for name in ("llama", "ggml", "ggml-cuda")
    for tail in ("", ".0", ".0.9.1")
)


def _wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("llama_cpp/__init__.py", "")
        z.writestr("llama_cpp/llama_cpp.py", "# the bindings\n")
        for lib in LIBS:
            z.writestr(f"llama_cpp/lib/{lib}", lib * 50)
            z.writestr(f"lib/{lib}", lib * 50)
        z.writestr("include/llama.h", "/* header */\n")
        z.writestr("bin/convert", "#!/bin/sh\n")
        z.writestr(INFO + "METADATA", "Metadata-Version: 2.1\nName: llama_cpp_python\n"
                   "Version: 0.3.36\n")  # fmt: skip
        z.writestr(INFO + "WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\n")
        z.writestr(INFO + "RECORD", "(stale)\n")
    return path


def test_each_library_stays_once_under_the_names_that_are_loaded(tmp_path: Path) -> None:
    src = _wheel(tmp_path / "in.whl")
    dst = tmp_path / "llama_cpp_python-0.3.36-py3-none-any.whl"
    kept, dropped = slim_wheel.slim(src, dst)
    with zipfile.ZipFile(dst) as z:
        names = set(z.namelist())
        record = z.read(INFO + "RECORD").decode().splitlines()
        files = {n: z.read(n) for n in names}
    libs = {n.rsplit("/", 1)[-1] for n in names if "/lib/" in n}
    assert libs == {"libllama.so", "libllama.so.0", "libggml.so", "libggml.so.0",
                    "libggml-cuda.so.0"}  # fmt: skip
    assert not any(n.startswith(("lib/", "include/", "bin/")) for n in names)
    assert {"llama_cpp/__init__.py", "llama_cpp/llama_cpp.py", INFO + "METADATA"} <= names
    assert kept + dropped + 1 == 2 * len(LIBS) + 7  # RECORD is written anew
    # RECORD lists every entry but itself with its own hash and size
    rows = {line.split(",")[0]: line.split(",")[1:] for line in record}
    assert set(rows) == names and rows[INFO + "RECORD"] == ["", ""]
    for name, (digest, size) in ((n, r) for n, r in rows.items() if r[0]):
        want = base64.urlsafe_b64encode(hashlib.sha256(files[name]).digest()).rstrip(b"=")
        assert digest == "sha256=" + want.decode() and int(size) == len(files[name])
    # and pip installs it
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                           "--no-deps", "--target", str(site), str(dst)],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (site / "llama_cpp/lib/libggml-cuda.so.0").read_bytes() == b"libggml-cuda.so.0" * 50
