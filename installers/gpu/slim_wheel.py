"""A llama-cpp-python wheel cut down to what its Python package loads.

A wheel cannot hold symbolic links, so llama-cpp-python's build stores every shared
library three times (``libX.so``, ``libX.so.0``, ``libX.so.0.25.3``) and once more
outside the package (``lib/``, with ``include/``); with CUDA that is six copies of a
60 MB ``libggml-cuda.so``, 263 MB in all, and the device machine takes along 64 MiB.
The package itself needs each library once: under the names its Python code opens
(``libllama.so``, ``libggml.so``, ...) and under the sonames the libraries ask each
other for (``libggml-cuda.so.0``; they find them through RUNPATH ``$ORIGIN``). The
rest goes, RECORD is rewritten to match, and the entries are stored with LZMA.

    python installers/gpu/slim_wheel.py IN.whl OUT.whl
"""

from __future__ import annotations

import base64
import hashlib
import re
import sys
import zipfile
from pathlib import Path

PACKAGE = "llama_cpp/"
# the libraries llama_cpp's modules open by name (load_shared_library("llama", ...) and so on)
OPENED = {"libllama.so", "libggml.so", "libmtmd.so", "libllava.so"}
SONAME = re.compile(r"^lib[\w.+-]+?\.so\.\d+$")  # libggml-cuda.so.0, not .so.0.25.3


def keep(name: str) -> bool:
    """Whether an entry of the wheel stays: the package (one copy of each library, by
    the names that are opened or asked for) and its metadata, nothing outside it."""
    if ".dist-info/" in name:
        return True
    if not name.startswith(PACKAGE):
        return False  # lib/, include/, bin/: the C library's own install, unused by Python
    base = name.rsplit("/", 1)[-1]
    if "/lib/" in name and ".so" in base:
        return base in OPENED or bool(SONAME.match(base))
    return True


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def slim(src: Path, dst: Path) -> tuple[int, int]:
    """Writes the slim wheel; returns (entries kept, entries dropped)."""
    kept, dropped, lines = 0, 0, []
    with zipfile.ZipFile(src) as zin:
        record = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        tmp = dst.with_name(dst.name + ".part")
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_LZMA) as zout:
            for info in zin.infolist():
                if info.filename == record:
                    continue
                if not keep(info.filename):
                    dropped += 1
                    continue
                data = zin.read(info)
                zout.writestr(info, data, compress_type=zipfile.ZIP_LZMA)
                lines.append(_record_line(info.filename, data))
                kept += 1
            zout.writestr(record, "\n".join([*lines, f"{record},,"]) + "\n")
    tmp.replace(dst)
    return kept, dropped


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    kept, dropped = slim(Path(args[0]), Path(args[1]))
    print(f"kept {kept} entries, dropped {dropped}: {Path(args[1]).stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
