"""The list of deliberate differences from the peers stays short, reasoned, and the same as
the documentation's (docs/moving/differences.md) and the README's ("Moving from
dask-jobqueue")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.peers import differences

ROOT = Path(__file__).parents[2]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("PAGE", [ROOT / "docs" / "moving" / "differences.md",
                                  ROOT / "README.md"], ids=["docs", "README"])
def test_the_guide_shows_the_list_as_it_is(PAGE: Path):
    text = PAGE.read_text()
    begin, end = text.find(differences.BEGIN), text.find(differences.END)
    assert 0 <= begin < end, f"{PAGE} lost its markers {differences.BEGIN!r} ... {differences.END!r}"
    shown = text[begin:end + len(differences.END)]
    assert shown == differences.markdown(), (
        f"{PAGE} and tests/peers/differences.py differ: put the output of "
        "'python -m tests.peers.differences' between the page's markers")


@pytest.mark.timeout(30)
def test_the_list_is_short_and_every_difference_says_why():
    assert 0 < len(differences.DIFFERENCES) < 15
    seen: set[str] = set()
    for key, reason in differences.DIFFERENCES.items():
        assert isinstance(key, tuple) and key, key
        assert len(reason.split()) >= 8, f"{key}: say why, in a sentence: {reason!r}"
        for pattern in key:
            assert re.fullmatch(r"test_\w+\.py(::\S+)?", pattern), pattern
            assert pattern not in seen, f"{pattern} listed twice"
            seen.add(pattern)


@pytest.mark.timeout(30)
def test_the_dask_jobqueue_page_includes_the_list_instead_of_keeping_one_of_its_own():
    """docs/moving/dask-jobqueue.md shows the differences by including the generated list
    (between its markers) under "What differs, and why", and lists none of its own there."""
    text = (ROOT / "docs" / "moving" / "dask-jobqueue.md").read_text()
    heading = text.find("\n## What differs, and why\n")
    assert heading >= 0, "the page lost its section 'What differs, and why'"
    section = text[heading + 1:]
    following = section.find("\n## ", 1)
    section = section if following < 0 else section[:following]
    include = re.search(r"^```\{include\} differences\.md\n:start-after: (.+)\n"
                        r":end-before: (.+)\n```$", section, re.M)
    assert include, "the section does not include docs/moving/differences.md"
    assert include.groups() == (differences.BEGIN, differences.END)
    assert not re.search(r"^(\*|-|\d+\.) ", section, re.M), \
        "the section keeps a list of its own beside the included one"
