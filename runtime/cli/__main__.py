"""`python -m warmstart.runtime.cli` is `warmstart`."""

from ._main import main

raise SystemExit(main())
