import pytest

from jupyter_gpualloc.kernel.sizes import InputError, format_duration, format_mib, parse_duration, parse_size


@pytest.mark.parametrize("text, mib", [
    ("10GB", 10240), ("10G", 10240), ("10GiB", 10240), ("10240MB", 10240),
    ("10gb", 10240), ("10 GB", 10240), ("1.5GB", 1536), ("512M", 512), ("512MiB", 512), (".5G", 512),
    ("4.75GiB", 4864), ("1MB", 1),
])
def test_sizes_people_type(text, mib):
    assert parse_size(text) == mib


@pytest.mark.parametrize("text", ["10 bananas", "10", "GB", "", "-5GB", "0GB", "10TB", "10GBs", "ten GB", "1e3MB"])
def test_anything_else_says_what_is_accepted(text):
    with pytest.raises(InputError) as caught:
        parse_size(text)
    assert str(caught.value) == f"size '{text}' not understood: use e.g. 10GB, 10G, 10GiB or 10240MB"


@pytest.mark.parametrize("text, seconds", [
    ("90", 90), ("90s", 90), ("10m", 600), ("1h", 3600), ("1h30m", 5400), ("2.5m", 150), ("1h 5s", 3605),
])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["10x", "m", "", "10m5", "soon"])
def test_bad_durations(text):
    with pytest.raises(InputError, match="duration .* not understood: use e.g. 30s, 10m, 1h or 1h30m"):
        parse_duration(text)


def test_formatting():
    assert format_mib(8192) == "8 GiB"
    assert format_mib(4864) == "4.75 GiB"
    assert format_mib(512) == "512 MiB"
    assert format_duration(3725) == "1h 2m 5s"
    assert format_duration(300) == "5m"
    assert format_duration(0.2) == "0s"
