from warmstart.runtime.kvstore._batches import chunk_spans
from warmstart.runtime.kvstore._index import IndexRow
from warmstart.runtime.kvstore._keys import chunk_key, root_key
from warmstart.runtime.kvstore._ledger import Ledger, Record

ROOT = root_key("fp")


def add_chain(ledger: Ledger, token_runs: list[list[int]], slot_base: int = 0) -> list[Record]:
    parent, start, out = ROOT, 0, []
    for i, run in enumerate(token_runs):
        key = chunk_key(parent, run)
        out.append(
            ledger.add(Record(key, parent, start, tuple(run), 100 * len(run), slot=slot_base + i))
        )
        parent, start = key, start + len(run)
    return out


def test_lookup_follows_whole_chunks_along_the_batches() -> None:
    ledger = Ledger()
    recs = add_chain(ledger, [[1, 2, 3], [4, 5, 6], [7, 8]])
    hits = ledger.lookup(ROOT, [1, 2, 3, 4, 5, 6, 7, 8, 9], chunk_spans([3, 6, 8, 9]))
    assert [h.record for h in hits] == recs and hits[-1].end == 8
    # diverges inside the second chunk: only whole chunks are used
    hits = ledger.lookup(ROOT, [1, 2, 3, 4, 5, 9], chunk_spans([3, 6]))
    assert [(h.record, h.use) for h in hits] == [(recs[0], 3)]
    assert ledger.lookup(ROOT, [9, 9], chunk_spans([2])) == []


def test_a_chunk_from_other_batches_is_never_used() -> None:
    ledger = Ledger()
    add_chain(ledger, [[1, 2], [3, 4]])
    # the same tokens, prefilled in batches ending at 3 and 4: no chunk of [0, 3)
    assert ledger.lookup(ROOT, [1, 2, 3, 4, 5], chunk_spans([3, 4])) == []
    longer = add_chain(ledger, [[1, 2], [3, 4, 5, 6]])[1]
    hits = ledger.lookup(ROOT, [1, 2, 3, 4, 5, 6, 0], chunk_spans([2, 6]))
    assert hits[-1].record is longer and hits[-1].end == 6


def test_shared_prefix_is_one_set_of_records() -> None:
    ledger = Ledger()
    a = add_chain(ledger, [[1, 2], [3]])
    b = add_chain(ledger, [[1, 2], [4]])
    assert a[0] is b[0] and len(ledger) == 3


def test_chain_needs_every_link() -> None:
    ledger = Ledger()
    head, tail = add_chain(ledger, [[1, 2], [3]])
    assert ledger.chain(tail.key) == [head, tail]
    ledger.remove(head.key)
    assert ledger.chain(tail.key) == []


def test_pinned_records_are_never_removed_nor_demoted() -> None:
    ledger = Ledger()
    recs = add_chain(ledger, [[1], [2], [3]])
    ledger.pin([recs[1]])
    assert ledger.remove(recs[1].key) is None and recs[1].key in ledger
    assert recs[1] not in ledger.demotion_order(min_residency_s=0)
    ledger.unpin([recs[1]])
    assert ledger.remove(recs[1].key) is recs[1]


def test_demotion_order_protects_first_chunks_and_fresh_promotions() -> None:
    now = [100.0]
    ledger = Ledger(clock=lambda: now[0])
    first, cold, warm, fresh = add_chain(ledger, [[1], [2], [3], [4]])
    for rec, used, promoted in ((first, 1, 0), (cold, 2, 0), (warm, 50, 0), (fresh, 3, 99)):
        rec.last_used, rec.promoted_at = used, promoted
    order = ledger.demotion_order(min_residency_s=10)
    assert order[:2] == [cold, warm]
    assert sorted(r.start for r in order[2:]) == [first.start, fresh.start]


def test_a_run_of_one_token_batches_is_one_chunk_of_its_own_kind() -> None:
    """A reply's tokens, decoded (or prefilled) a token at a time, are one chunk; the
    same tokens prefilled as one batch have other KV bits, so another key."""
    ledger = Ledger()
    key = chunk_key(ROOT, [1, 2, 3], stepped=True)
    ledger.add(Record(key, ROOT, 0, (1, 2, 3), 300, slot=0))
    stepped = ledger.lookup(ROOT, [1, 2, 3, 4, 5], chunk_spans([1, 2, 3, 5]))
    assert [(h.record.key, h.end) for h in stepped] == [(key, 3)]
    assert ledger.lookup(ROOT, [1, 2, 3, 4, 5], chunk_spans([3, 5])) == []


def test_adopting_a_disk_tiers_rows_marks_known_chunks_and_adds_the_rest_coldest() -> None:
    ledger = Ledger(clock=lambda: 50.0)
    (known,) = add_chain(ledger, [[1, 2]])
    rows = [
        IndexRow(known.key, known.parent, 0, known.tokens, known.nbytes),
        IndexRow(b"n" * 16, known.key, 2, (3, 4), 700),
    ]
    ledger.adopt(rows)
    assert known.on_disk and known.last_used == 50.0
    new = ledger.get(b"n" * 16)
    assert new is not None and new.on_disk and new.slot is None and new.nbytes == 700
    assert ledger.chain(new.key) == [known, new]
