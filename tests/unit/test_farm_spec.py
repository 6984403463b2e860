"""Farm files: read whole, each mistake a one-line error naming it."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from tandem.farm import spec
from tandem.farm.spec import FarmSpecError


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "farm.toml"
    p.write_text(text)
    return p


def test_a_farm_file_reads_into_its_parts(tmp_path):
    (tmp_path / "recs" / "a.tdm").mkdir(parents=True)
    (tmp_path / "recs" / "b.tdm").mkdir()
    s = spec.load(write(tmp_path, '[corpus]\nbundles = ["recs/*.tdm", "recs/a.tdm"]\n'
                                  '[analyses]\nnames = ["kasan"]\nkernels = ["mine=/k/bzImage"]\n'
                                  '[settings]\ndb = "night.sqlite"\nrepeats = 1\nnight = "n1"\npin = false\n'))
    assert s.analyses == ("kasan",) and s.kernels == ("mine=/k/bzImage",)
    assert [p.name for p in s.bundle_dirs()] == ["a.tdm", "b.tdm"]      # each once, in order
    assert s.settings.repeats == 1 and not s.settings.pin and s.path(s.settings.db) == tmp_path / "night.sqlite"


BAD = [
    ('[corpus]\nbundles = ["x"]\n[analyses]\nnames = ["kasan"]\n[setting]\n', "setting: not a farm file section"),
    ('[corpus]\nbundle = ["x"]\n', "corpus.bundle: not a key of [corpus] (bundles)"),
    ('[corpus]\nbundles = "x"\n', "corpus.bundles: 'x' is not a list of text"),
    ('corpus = 3\n', "corpus: a table ([corpus]), not int"),
    ('[corpus]\nbundles = ["x"]\n[settings]\nrepeats = "2"\n', "settings.repeats: '2' is not a whole number"),
    ('[corpus]\nbundles = ["x"]\n[settings]\nrepeats = 11\n', "settings.repeats: 11 is not 0 to 10"),
    ('[corpus]\nbundles = ["x"]\n[settings]\nexact = 1\n', "settings.exact: 1 is not true or false"),
    ('[corpus]\nbundles = ["x"]\n[settings]\npin = "yes"\n', "settings.pin: 'yes' is not true or false"),
    ('[corpus]\nbundles = ["x"]\n[settings]\nnight = "../x"\n', "settings.night: '../x' is not a night's name"),
    ('[corpus]\nbundles = ["x"]\n[settings]\nscheduler = "h:8786"\n', "is not a Dask scheduler address"),
    ('[corpus]\nbundles = []\n', "corpus.bundles: no recordings named"),
    ('[corpus]\nbundles = ["x"]\n[settings]\nexact = false\n', "the night would do nothing"),
    ('[corpus\n', "not valid TOML"),
]


@pytest.mark.parametrize("text,message", BAD, ids=[m for _, m in BAD])
def test_a_bad_farm_file_is_one_line_naming_the_culprit(tmp_path, text, message):
    with pytest.raises(FarmSpecError) as e:
        spec.load(write(tmp_path, text))
    assert message in str(e.value) and "\n" not in str(e.value) and str(tmp_path) in str(e.value)


def test_a_pattern_that_names_nothing_is_an_error(tmp_path):
    s = spec.load(write(tmp_path, '[corpus]\nbundles = ["recs/*.tdm"]\n'))
    with pytest.raises(FarmSpecError, match=r"corpus: 'recs/\*.tdm' names no recording bundle"):
        s.bundle_dirs()


def test_not_utf8_and_too_big_are_errors(tmp_path):
    p = tmp_path / "farm.toml"
    p.write_bytes(b"\xff\xfe")
    with pytest.raises(FarmSpecError, match="not UTF-8"):
        spec.load(p)
    p.write_bytes(b"#" * (spec.SPEC_MAX + 1))
    with pytest.raises(FarmSpecError, match="over"):
        spec.load(p)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                    max_leaves=12))
def test_any_decoded_document_is_a_spec_or_a_one_line_error(doc):
    for d in (doc, {"corpus": doc}, {"settings": doc}, {"corpus": {"bundles": ["x"]}, "settings": doc}):
        if not isinstance(d, dict):
            continue
        try:
            spec.parse(d)
        except FarmSpecError as e:
            assert "\n" not in str(e)
