"""The disk budget is the cache folder's size: diskcache keeps its blobs and cache.db
within its limit but counts neither the SQLite write-ahead logs nor index.db, so the
soak run's folder reached 168.6 MiB against a budget of 160. The tier gives
diskcache the budget less what diskcache does not count."""

from pathlib import Path

from warmstart.runtime.kvstore._disk import DiskTier
from warmstart.runtime.kvstore._pool import RamPool
from warmstart.runtime.kvstore._store import TieredStore

from .test_disk_usage import SLOT, fill, walked

BUDGET = 24 << 20


def test_the_whole_folder_stays_within_the_budget(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, "fp", 0, BUDGET)
    store = TieredStore("fp", RamPool(4 * SLOT, SLOT), tier, min_residency_s=0)
    sizes: list[int] = []
    # 60 MB of incompressible 200 KB chunks (a file each, as a real chunk is): the
    # budget is reached and culled at; the folder is walked after every write
    fill(store, 300, size=200 << 10, each=lambda: sizes.append(walked(tmp_path)))
    assert store.stats().culled > 0
    most = max(sizes)
    assert most <= BUDGET, f"the folder reached {most / 2**20:.1f} MiB of {BUDGET / 2**20:.0f}"
    assert store.stats().disk.used_bytes == walked(tmp_path)
    store.close()
