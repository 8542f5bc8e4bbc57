"""What a prompt reuses of a computed KV, and how a finished reply is re-prefilled for
the next turn, over plain lists (runtime/kvstore/_batches.py)."""

from warmstart.runtime.kvstore._batches import common_prefix, live_prefix, reply_plan, reusable


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([5, 6], [5, 6]) == 2


def test_a_prefix_is_reused_up_to_the_last_identical_batch_over_identical_tokens() -> None:
    held = list(range(10))
    ids = [*range(9), 99, 100, 101]
    assert reusable([4, 8, 10], held, ids, [4, 8, 12]) == 8
    assert reusable([4, 8, 10], held, ids, [4, 6, 8, 12]) == 4  # other batches after 4
    assert reusable([4, 8, 10], held, [5, *range(1, 12)], [4, 8, 12]) == 0
    assert reusable([], [], ids, [4, 8, 12]) == 0


def test_the_last_batch_is_recomputed_unless_its_logits_were_kept() -> None:
    held = list(range(10))
    assert live_prefix([4, 8, 10], held, held, [4, 8, 10]) == 8
    assert live_prefix([4, 8, 10], held, held, [4, 8, 10], logits_at=10) == 10
    assert live_prefix([4, 8, 10], held, held[:9], [4, 8, 9], logits_at=10) == 8
    # logits of another prompt's end (a longer one): the last batch is recomputed
    longer = [*held, 10, 11]
    assert live_prefix([4, 8, 10], held, longer, [4, 8, 10, 12], logits_at=10) == 10


def test_a_reply_cut_by_max_tokens_is_closed_by_a_decode_or_two() -> None:
    # a prompt of 10 tokens, two reply tokens decoded a token at a time, the third
    # sampled but never decoded; the next turn steps through all three
    held, bounds = list(range(12)), [8, 10, 11, 12]
    target, cuts = [*held, 12, 13, 14], [8, 10, 11, 12, 13, 15]
    plan = reply_plan(bounds, held, target, cuts, prompt_tokens=10)
    assert (plan.reused, plan.cuts, plan.closing) == (12, [13, 15], 13)
    assert plan.target == target
    # the third token decoded (an end of turn): nothing to close, the markup to prefill
    plan = reply_plan([*bounds, 13], [*held, 12], target, cuts, prompt_tokens=10)
    assert (plan.reused, plan.cuts, plan.closing) == (13, [15], None)
    # a reply re-prefilled along other batches: from the prompt's end, nothing closed
    plan = reply_plan([8, 10, 11, 12], held, target, [8, 10, 15], prompt_tokens=10)
    assert (plan.reused, plan.cuts, plan.closing) == (10, [15], None)
    # the end of turn a one-token batch too (the next turn opens right after it, as
    # in Llama 3's markup): the run of one-token batches ends after it, two decodes
    target, cuts = [*held, 12, 13, 14, 15], [8, 10, 11, 12, 13, 14, 16]
    plan = reply_plan(bounds, held, target, cuts, prompt_tokens=10)
    assert (plan.reused, plan.cuts, plan.closing) == (12, [13, 14, 16], 14)
    # a reply the template renders otherwise: from where it differs, three one-token
    # batches to the run's end, more than a waiting request waits for: none closed
    plan = reply_plan(bounds, held, [*range(10), 7, 7, 7], [8, 10, 11, 12, 13], 10)
    assert (plan.reused, plan.cuts, plan.closing) == (10, [11, 12, 13], None)
    # nothing of the reply kept as decoded: the prompt's own end is not closed
    plan = reply_plan([8, 10], held[:10], target, cuts, prompt_tokens=12)
    assert (plan.reused, plan.closing) == (10, None)
