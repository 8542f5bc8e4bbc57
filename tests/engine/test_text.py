from warmstart.runtime.engine._text import TextAssembler


def feed_all(asm: TextAssembler, pieces: list[bytes]) -> str:
    return "".join(asm.feed(p) for p in pieces) + asm.flush()


def test_plain_text_passes_through() -> None:
    assert feed_all(TextAssembler(), [b"Hel", b"lo"]) == "Hello"


def test_utf8_split_across_tokens_is_reassembled() -> None:
    snow = "☃".encode()
    assert feed_all(TextAssembler(), [snow[:1], snow[1:], b"!"]) == "☃!"


def test_stop_string_is_cut_and_never_emitted_even_across_tokens() -> None:
    asm = TextAssembler(("STOP",))
    out = [asm.feed(b"abc ST"), asm.feed(b"O"), asm.feed(b"P tail")]
    assert out[0] == "abc " and "".join(out) == "abc " and asm.stopped
    assert asm.flush() == "" and asm.text == "abc "


def test_the_stop_string_that_matched_is_named() -> None:
    asm = TextAssembler(("zz", "END"))
    asm.feed(b"the EN")
    assert asm.matched is None
    asm.feed(b"D")
    assert asm.matched == "END"


def test_held_back_prefix_is_released_when_it_is_not_a_stop() -> None:
    asm = TextAssembler(("STOP",))
    assert asm.feed(b"ST") == "" and asm.feed(b"ART") == "START"
    assert not asm.stopped and asm.matched is None
