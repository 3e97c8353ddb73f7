import pytest

from unikv import Band, Grow, Layout, Unit


def test_band_coerces_strings_to_enums():
    b = Band("swa", entry_bytes=300, grow="float", page_size=4)
    assert b.grow is Grow.FLOAT and b.unit is Unit.TOKEN and b.page_bytes == 1200


@pytest.mark.parametrize("kw, needle", [
    (dict(entry_bytes=0), "entry_bytes=0"),
    (dict(entry_bytes=-5), "entry_bytes=-5"),
    (dict(entry_bytes=8, page_size=0), "page_size=0"),
    (dict(entry_bytes=8, grow="sideways"), "grow='sideways'"),
    (dict(entry_bytes=8, unit="byte"), "unit='byte'"),
    (dict(entry_bytes=8, unit="request", page_size=4), "page_size=4"),
    (dict(entry_bytes=2.5), "entry_bytes=2.5"),
])
def test_band_rejects_bad_fields(kw, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        Band("x", **kw)


def test_band_needs_a_name():
    with pytest.raises(ValueError, match="name"):
        Band("", entry_bytes=8)


def _bands(*grows):
    return [Band(f"b{i}", entry_bytes=100, grow=g) for i, g in enumerate(grows)]


@pytest.mark.parametrize("grows", [
    ("float",), ("up", "float"), ("float", "down"), ("down", "up"), ("up", "up"),
    ("up", "up", "down"),  # was accepted: a band that could never allocate
    ("up", "down", "down"),  # was accepted: a band that could never allocate
    ("up", "float", "float", "down"),
])
def test_layout_rejects_bad_chains_naming_them_and_the_supported_ones(grows):
    chain = " | ".join(f"b{i}({g})" for i, g in enumerate(grows))
    with pytest.raises(ValueError) as err:
        Layout(total_bytes=100_000, bands=_bands(*grows))
    assert str(err.value) == (f"Layout: bands={chain} (low byte -> high byte) is not a supported "
                              "chain; supported chains are up, down, up|down, up|float|down, with any units")


def test_layout_rejects_duplicates_and_mixed_page_sizes():
    with pytest.raises(ValueError, match="duplicate band names \\['a'\\]"):
        Layout(total_bytes=10_000, bands=[Band("a", entry_bytes=10, grow="up"),
                                          Band("a", entry_bytes=10, grow="down")])
    with pytest.raises(ValueError, match="share one page_size"):
        Layout(total_bytes=10_000, bands=[Band("a", entry_bytes=10, grow="up", page_size=2),
                                          Band("b", entry_bytes=10, grow="down", page_size=4)])


def test_layout_rejects_a_buffer_too_small_for_sink_plus_one_page_each():
    bands = [Band("a", entry_bytes=100, grow="up"), Band("b", entry_bytes=100, grow="down")]
    with pytest.raises(ValueError, match="too small"):
        Layout(total_bytes=250, bands=bands)  # sink 100 + 2 pages of 100 = 300
    Layout(total_bytes=300, bands=bands)
    with pytest.raises(ValueError, match="total_bytes=0"):
        Layout(total_bytes=0, bands=bands)
    with pytest.raises(ValueError, match="at least one"):
        Layout(total_bytes=300, bands=[])


def test_sink_and_page_math():
    layout = Layout(total_bytes=1 << 20, bands=[
        Band("mamba", entry_bytes=5000, grow="up", unit="request"),
        Band("swa", entry_bytes=300, grow="float", page_size=4),
        Band("full", entry_bytes=700, grow="down", page_size=4),
    ])
    # sink = max(entry bytes 5000, token page bytes 1200, 2800)
    assert layout.sink_bytes == 5000
    swa = layout.geometry("swa")
    assert swa.max_slots == (1 << 20) // 300
    assert swa.min_page == 5  # ceil(ceil(5000/300)=17 / 4)
    assert swa.min_page * swa.page_bytes >= layout.sink_bytes
    full = layout.geometry("full")
    assert (full.min_page, full.num_pages) == (2, (1 << 20) // 700 // 4)
    assert layout.page_size == 4
    assert [b.name for b in layout.token_bands] == ["swa", "full"]
    with pytest.raises(KeyError, match="unknown band 'nope'"):
        layout.geometry("nope")
