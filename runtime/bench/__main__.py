"""`python -m warmstart.runtime.bench`: warmstart beside llama-server and hearth-llm
(`make bench-peers`); `warmstart bench` is the in-process one."""

from ._bench_peers import main

raise SystemExit(main())
