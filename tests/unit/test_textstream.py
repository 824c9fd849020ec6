from backends.textstream import TextStream


def _bytes_of(pieces: dict[int, bytes]):
    return lambda ids: b"".join(pieces[i] for i in ids)


def test_stop_string_split_across_tokens_is_never_shown() -> None:
    pieces = {1: b"Hello", 2: b" <|im", 3: b"_end|>", 4: b" more"}
    ts = TextStream(_bytes_of(pieces), stop=("<|im_end|>",))
    out = [ts.push([1]), ts.push([2]), ts.push([3])]
    assert out == [("Hello", False), (" ", False), ("", True)]
    assert ts.text == "Hello " and ts.push([4]) == ("", True) and ts.flush() == ""


def test_partial_stop_released_when_not_a_stop() -> None:
    ts = TextStream(_bytes_of({1: b"a <", 2: b"b>"}), stop=("<|",))
    assert ts.push([1]) == ("a ", False)
    assert ts.push([2]) == ("<b>", False)


def test_split_utf8_character_held_until_complete() -> None:
    e_acute = "é".encode()
    ts = TextStream(_bytes_of({1: e_acute[:1], 2: e_acute[1:] + b"!"}))
    assert ts.push([1]) == ("", False)
    assert ts.push([2]) == ("é!", False)


def test_flush_releases_held_tail() -> None:
    ts = TextStream(_bytes_of({1: b"end <|im"}), stop=("<|im_end|>",))
    assert ts.push([1]) == ("end ", False)
    assert ts.flush() == "<|im" and ts.text == "end <|im"
