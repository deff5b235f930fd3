"""Files are read as their writer means them (#33): a key given twice is refused, not the last one kept, and
YAML 1.1's octal and base-60 numbers (num_layers: 040 would be 32) are refused, with libyaml and without."""

from __future__ import annotations

import pytest
import yaml

from advisor.errors import AdvisorError
from advisor.specs import untrusted


@pytest.fixture(params=["libyaml", "python"])
def loader(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setattr(yaml, "__with_libyaml__", False)
    elif not getattr(yaml, "__with_libyaml__", False):
        pytest.skip("PyYAML without libyaml")
    return request.param


@pytest.mark.parametrize("text,line", [("num_layers: 040\n", 1), ("a: 1\nseq: 1:30\n", 2), ("x: -1:30.5\n", 1)])
def test_yaml11_octal_and_base60_numbers_are_refused(loader, text, line):
    with pytest.raises(AdvisorError, match=rf"model.yaml: .*\(line {line}\) is a YAML 1.1"):
        untrusted.parse(text, "model.yaml", "yaml")


def test_numbers_read_as_written(loader):
    data = untrusted.parse("a: 40\nb: 0\nc: 1_000\nd: -3\ne: 0.5\nf: 0x10\ng: '040'\n", "m.yaml", "yaml")
    assert data == {"a": 40, "b": 0, "c": 1000, "d": -3, "e": 0.5, "f": 16, "g": "040"}


def test_a_key_given_twice_is_refused_in_yaml_and_json(loader):
    with pytest.raises(AdvisorError, match=r"m.yaml: key 'hidden_size' is given twice in one mapping \(line 3\)"):
        untrusted.parse("name: m\nhidden_size: 1\nhidden_size: 2\n", "m.yaml", "yaml")
    with pytest.raises(AdvisorError, match=r"plan.json: malformed JSON: key 'parallel' is given twice"):
        untrusted.parse('{"parallel": {}, "parallel": {"tp": 2}}', "plan.json", "json")


def test_merge_keys_still_override(loader):
    data = untrusted.parse("base: &b {x: 1, y: 2}\nm:\n  <<: *b\n  x: 3\n", "m.yaml", "yaml")
    assert data["m"] == {"x": 3, "y": 2}


def test_a_merge_key_bomb_is_refused_before_it_is_expanded(loader):
    """Nine lines, nine merges of the level before each: 9^8 mappings once merged. PyYAML expands merge keys while it
    constructs (a minute and more); the event stream's count refuses it first (the bound is on values, so the
    count of parser events, not wall time, is what this asserts)."""
    import yaml as _yaml

    lines = ["a0: &a0 {x: 1}"] + [f"a{i}: &a{i} {{<<: [{', '.join([f'*a{i - 1}'] * 9)}], y{i}: 1}}" for i in range(1, 9)]
    text = "\n".join(lines) + "\n"
    assert len(list(_yaml.parse(text))) < 300
    with pytest.raises(AdvisorError, match=r"bomb.yaml: its aliases expand it to more than 1,000,000 values"):
        untrusted.parse(text, "bomb.yaml", "yaml")
    small = "a0: &a0 {x: 1}\na1: {<<: [*a0, *a0], y: 2}\n"
    assert untrusted.parse(small, "ok.yaml", "yaml")["a1"] == {"x": 1, "y": 2}


def test_look_alike_characters_are_quoted_with_their_escapes():
    """#33: 'llаma3-8b' with a Cyrillic 'а' printed as itself reads as the bundled name."""
    from advisor.commands.inputs import resolve_inputs

    assert untrusted.prefix("ll\u0430ma3-8b") == "'ll\\u0430ma3-8b'"
    assert untrusted.prefix("llama3-8b") == "'llama3-8b'"
    with pytest.raises(AdvisorError, match=r"unknown model 'll\\u0430ma3-8b'"):
        resolve_inputs("ll\u0430ma3-8b", "dgx-h100", nodes=1)


def test_a_large_json_array_is_not_called_an_alias_bomb(tmp_path):
    path = tmp_path / "big.json"
    path.write_text("[" + ",".join(["0"] * 1_000_100) + "]")
    with pytest.raises(AdvisorError, match=r"big.json: more than 1,000,000 values, more than advisor reads") as err:
        untrusted.load_tree(path)
    assert "alias" not in str(err.value)


def test_mbs_that_does_not_divide_the_batch_names_mbs_and_says_the_batch_is_the_default():
    from advisor.commands.estimate_request import estimate_request

    with pytest.raises(AdvisorError, match=r"^--mbs 3: dp x micro-batch = 8 x 3 = 24 does not divide the global batch "
                                           r"512 \(the default; --gbs sets it\); --mbs 2, 4, 8, 16, 32, 64 would"):
        estimate_request("llama3-8b", "dgx-h100", 1, None, job={}, strategy={"micro_batch_size": 3})
    with pytest.raises(AdvisorError, match=r"^--mbs 3 with --gbs 64: .* the global batch 64; --mbs 1, 2, 4, 8 would"):
        estimate_request("llama3-8b", "dgx-h100", 1, None, job={"global_batch_size": 64},
                         strategy={"micro_batch_size": 3})
