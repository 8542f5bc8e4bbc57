import subprocess
import sys

import warmstart.runtime as runtime


def test_all_names_resolve_and_nothing_public_is_missing() -> None:
    for name in runtime.__all__:
        assert getattr(runtime, name) is not None, name
    public = {n for n in vars(runtime) if not n.startswith("_") and n not in ("Any",)}
    modules = {n for n in public if type(getattr(runtime, n)).__name__ == "module"}
    assert public - modules <= set(runtime.__all__)


def test_the_light_parts_load_without_llama_cpp() -> None:
    code = (
        "import warmstart.runtime as runtime, sys; runtime.FakeOptions; "
        "assert 'llama_cpp' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
