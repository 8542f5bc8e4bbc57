"""`python -m warmstart.runtime.bench`: warmstart beside llama-server and hearth-llm
(`make bench-peers`); `... bench soak`: a household's load for half an hour (`make
bench-soak`); `warmstart bench` is the in-process one."""

import sys

if sys.argv[1:2] == ["soak"]:
    from ._soak import main as soak

    raise SystemExit(soak(sys.argv[2:]))

from ._bench_peers import main

raise SystemExit(main())
