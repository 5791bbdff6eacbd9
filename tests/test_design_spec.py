"""A design's one-line spec (``design.design_spec``) and its reader (``design.parse_design``): the string the planner
prints and ``reco-sampled plan --design`` / RecBole's ``rsp_design`` take reads back as the same design."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from _profiles import examples
from reco_sampled_plugin import registry
from reco_sampled_plugin._checks import MAX_SAMPLES
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
    ("a:b", "^expected a design spec M"),
    ("100:foo", "^expected a design spec M"),
    ("100:3200:exact:exact", "^expected a design spec M"),
    ("20+x", "^expected a design spec M"),
    ("100+", "^expected a design spec M"),
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
    with pytest.raises(ValueError, match="^expected a design spec"):
        parse_design(100)  # type: ignore[arg-type]  # a spec is a string (an int m is as_design's)


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
