"""A design's one-line spec (``design.design_spec``) and its reader (``design.parse_design``): the string the planner
prints and ``reco-sampled plan --design`` / RecBole's ``rsp_design`` take reads back as the same design."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from _profiles import examples
from reco_sampled_plugin import registry
from reco_sampled_plugin._checks import MAX_SAMPLES, ArgumentTypeError
from reco_sampled_plugin.design import ExactShare, SamplingDesign, design_spec, parse_design
from reco_sampled_plugin.planner import default_designs


@st.composite
def _designs(draw: st.DrawFn) -> SamplingDesign:
    """Every kind of design the planner forecasts without popularity weights: fixed m with or without replacement,
    adaptive (``exact_at_cap`` or not), with or without an exact share (uniform or active, the default metric or
    another)."""
    m = draw(st.integers(1, MAX_SAMPLES))
    kind = draw(st.sampled_from(["fixed", "norepl", "adaptive", "exact"]))
    cap = draw(st.integers(m, MAX_SAMPLES)) if kind in ("adaptive", "exact") else None
    share = None
    if kind != "exact" and draw(st.booleans()):
        metric = draw(st.sampled_from(["ndcg@10", "recall@20", "mrr", "hit@5"]))
        share = ExactShare(draw(st.floats(1e-6, 1.0)), choice=draw(st.sampled_from(["uniform", "active"])),
                           metric=metric)
    return SamplingDesign(m, replacement=kind != "norepl", adaptive_max=cap, exact_at_cap=kind == "exact",
                          exact_share=share)


@settings(max_examples=examples(40))
@given(_designs())
def test_a_spec_reads_back_as_its_design(design):
    spec = design_spec(design)
    assert parse_design(spec) == design
    assert parse_design(f" {spec} ") == design  # surrounding blanks (a YAML value, a shell argument)
    assert "+" not in spec or spec.split("+")[1].count(":") >= 1  # a share always names its choice


@pytest.mark.parametrize("n_items", [50, 900, 20_000, 2_000_000])
@pytest.mark.parametrize("method", ["auto", "mes", "bv"])
def test_the_default_grids_specs_read_back(n_items, method):
    designs = default_designs(n_items, method)
    specs = [design_spec(d) for d in designs]
    assert [parse_design(s) for s in specs] == designs and len(set(specs)) == len(specs)
    if method == "auto" and n_items == 20_000:  # the grid's kinds, written as the CLI's --design takes them
        assert "100" in specs and "100:12800:exact" in specs and "100:12800+0.03:active" in specs


@pytest.mark.parametrize("spec, design", [
    ("100", SamplingDesign(100)),
    ("100:norepl", SamplingDesign(100, replacement=False)),
    ("100:3200", SamplingDesign(100, adaptive_max=3200)),
    ("100:3200:exact", SamplingDesign(100, adaptive_max=3200, exact_at_cap=True)),
    ("20+0.2", SamplingDesign(20, exact_share=ExactShare(0.2))),
    ("20+0.2:uniform", SamplingDesign(20, exact_share=ExactShare(0.2))),
    ("100:12800+0.03:active", SamplingDesign(100, adaptive_max=12800, exact_share=ExactShare(0.03, choice="active"))),
    ("20+0.1:active:recall@20", SamplingDesign(20, exact_share=ExactShare(0.1, choice="active", metric="recall@20"))),
], ids=lambda v: v if isinstance(v, str) else "")
def test_the_syntax(spec, design):
    assert parse_design(spec) == design


@pytest.mark.parametrize("spec, match", [
    ("a:b", "^spec: expected a design spec M"),
    ("100:foo", "^spec: expected a design spec M"),
    ("100:3200:exact:exact", "^spec: expected a design spec M"),
    ("20+x", "^spec: expected a design spec M"),
    ("100+", "^spec: expected a design spec M"),
    ("\u00b2", "^spec: expected a design spec M"),  # a digit to str.isdigit, not to int()
    ("100:\u00b2", "^spec: expected a design spec M"),
    ("\uff11\uff10\uff10", "^spec: expected a design spec M"),  # fullwidth digits: ASCII digits only
    ("", "^spec: expected a design spec M"),
    ("100:exact", "^exact_at_cap: completes the positives still first at the cap"),
    ("100:3200:norepl", "^replacement: adaptive sampling draws with replacement"),
    ("100:50", "^adaptive_max: must be at least n_samples"),
    ("20+1.5", r"^share: expected a number in \(0, 1\]"),
    ("20+0.1:greedy", "^choice: expected one of"),
    ("0", "^n_samples: must be >= 1"),
])
def test_a_bad_spec_is_named(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_design(spec)
    with pytest.raises(ArgumentTypeError, match="^spec: expected a design spec"):
        parse_design(100)  # type: ignore[arg-type]  # a spec is a string (an int m is as_design's)


#: What a refusal of parse_design may start with: the spec itself, or the field of the design it sets
_SPEC_NAMES = r"^(spec|n_samples|adaptive_max|exact_at_cap|replacement|exact_share|share|choice|metric|floor): "


@settings(max_examples=examples(30), deadline=None)
@given(text=st.one_of(st.text(max_size=20), st.from_regex(r"[0-9\u00b2\u0663\uff11:+.eanorplxctiv -]{0,14}",
                                                          fullmatch=True)))
def test_any_text_is_a_design_or_a_refusal_naming_the_spec(text):
    """Fuzz: any string reads as a SamplingDesign (its spec reading back as it) or gives a ValueError naming the spec
    or the design field it sets, never another exception (``int('\u00b2')`` fails though ``'\u00b2'.isdigit()``)."""
    try:
        design = parse_design(text)
    except ValueError as exc:
        assert re.match(_SPEC_NAMES, str(exc)), str(exc)
    else:
        assert parse_design(design_spec(design)) == design


def test_a_spec_refusal_names_the_callers_argument():
    """``name``: the argument the caller's user typed (RecBole's rsp_design); None is an ArgumentTypeError (a
    ValueError and a TypeError) naming it, as a non-string spec is."""
    with pytest.raises(ValueError, match="^rsp_design: expected a design spec"):
        parse_design("100:x", name="rsp_design")
    for bad in (None, b"100", ["100"], SamplingDesign(10)):
        with pytest.raises(ArgumentTypeError, match="^spec: expected a design spec"):
            parse_design(bad)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="^design: required, expected a SamplingDesign"):
        design_spec(None)  # type: ignore[arg-type]


def test_what_a_spec_cannot_hold_is_refused():
    assert design_spec(100) == "100"  # an int m, as anywhere a design is taken
    with pytest.raises(ValueError, match="^design: popularity m=10 draws by popularity weights"):
        design_spec(SamplingDesign(10, popularity=torch.ones(50)))
    with pytest.raises(ValueError, match="^design: its exact share sets floor = 0.001"):
        design_spec(SamplingDesign(10, exact_share=ExactShare(0.1, floor=0.001)))
    with pytest.raises(ValueError, match="seed = 3"):
        design_spec(SamplingDesign(10, exact_share=ExactShare(0.1, seed=3)))


def test_the_cli_reads_the_same_spec():
    import argparse

    from reco_sampled_plugin.cli import add_plan_parser

    parser = argparse.ArgumentParser()
    add_plan_parser(parser.add_subparsers())
    specs = ["100", "100:norepl", "50:800:exact", "100:12800+0.03:active"]
    required = ["--n-items", "1000", "--n-users", "10", "--metric", "hit@10", "--target-rel-error", "0.1"]
    args = parser.parse_args(["plan", *required, *(a for s in specs for a in ("--design", s))])
    assert args.design == [parse_design(s) for s in specs]
    assert registry.get("auto").supports(args.design[-1])


@pytest.mark.parametrize("choice", ["uniform", "active"])
def test_a_share_at_the_inclusion_floor_reads_back(choice):
    """A share below 5 x MIN_INCLUSION keeps the floor MIN_INCLUSION (not share / 5): its spec still reads back."""
    design = SamplingDesign(100, exact_share=ExactShare(3e-9, choice=choice))
    assert design.exact_share.floor == 1e-9
    assert parse_design(design_spec(design)) == design
    assert design_spec(parse_design(f"100+3e-09:{choice}")) == f"100+3e-09:{choice}"
