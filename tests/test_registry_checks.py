"""The registry checks what it is given: entries at registration (name, texts, compute and fitter references, options
and their defaults, metric kinds), what a registered compute function returns before an ``Estimate`` is built, and
the arguments of its query filters. Fuzzed over every wrong kind of each field (one field wrong at a time), with the
registry left as it was and the CLI still working after each refusal."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _profiles import examples

import reco_sampled_plugin as rsp
from reco_sampled_plugin import registry
from reco_sampled_plugin._estimate import EstimatorOutput
from reco_sampled_plugin.design import SamplingDesign
from reco_sampled_plugin.registry import Estimator, Option

SAMPLE = rsp.SampledRanks.from_arrays(torch.tensor([1, 2, 3, 5, 1, 2, 11, 4] * 25), 1000, 10)


def _fine_compute(spec, hist, *, method, sampling, options):
    return EstimatorOutput(0.5, 0.01, hist.total, {"method": method}, ())


def _wrong_signature(spec, hist):
    return EstimatorOutput(0.5, 0.01, 1.0, {}, ())


#: A valid entry's fields; each case below replaces one of them.
GOOD = dict(name="probe_ok", family="correction", summary="a probe", compute=_fine_compute, options=(),
            reference="")

#: (field, wrong value, the argument the message starts with): every wrong kind of every field of an entry.
WRONG_ENTRIES = [
    ("name", 3, "name"), ("name", None, "name"), ("name", "", "name"), ("name", "My Method", "name"),
    ("name", "with space", "name"), ("name", "class", "name"), ("name", "a-b", "name"), ("name", "x\n", "name"),
    ("name", "1abc", "name"), ("name", b"bytes", "name"),
    ("summary", None, "summary"), ("summary", "", "summary"), ("summary", 3, "summary"), ("summary", "a\nb", "summary"),
    ("reference", None, "reference"), ("reference", "line\nbreak", "reference"),
    ("family", "nope", "family"), ("family", 3, "family"), ("family", None, "family"),
    ("compute", 42, "compute"), ("compute", None, "compute"), ("compute", "corrections", "compute"),
    ("compute", ".corrections:no_such_function", "compute"), ("compute", "no_such_module_xyz:f", "compute"),
    ("compute", ".corrections:", "compute"), ("compute", "a b:c", "compute"),
    ("compute", ".corrections:MAX_ELEMENTS", "compute"), ("compute", _wrong_signature, "compute"),
    ("compute", "math:pi", "compute"),
    ("options", ("gamma",), "options"), ("options", Option("k", "count", 1), "options"),
    ("options", (Option("k", "count", 1), Option("k", "count", 2)), "options"),
    ("options", (Option("k", "count", -3),), "k"), ("options", (Option("k", "count", 2.5),), "k"),
    ("options", (Option("k", "fraction", 2.0),), "k"), ("options", (Option("k", "bootstrap", 2**40),), "k"),
    ("options", (Option("k", "spline_df", 2**40),), "k"), ("options", (Option("k", "choice", "z", choices=("a",)),), "k"),
    ("options", (Option("name", "count", 1),), "options"), ("options", (Option("top_shape", "count", 1),), "options"),
    ("adaptive", "yes", "adaptive"), ("adaptive", 1, "adaptive"), ("popularity", None, "popularity"),
    ("metrics", ("bogus",), "metrics"), ("metrics", "auc", "metrics"), ("metrics", (), "metrics"),
]

#: (option arguments, the argument the message starts with): options that cannot even be built.
WRONG_OPTIONS = [
    (dict(name="not valid", kind="count"), "name"), (dict(name="class", kind="count"), "name"),
    (dict(name=3, kind="count"), "name"), (dict(name="k", kind="integer-ish"), "kind"),
    (dict(name="k", kind=None), "kind"), (dict(name="k", kind="choice"), "choices"),
    (dict(name="k", kind="count", choices=("a",)), "choices"), (dict(name="k", kind="choice", choices=["a"]), "choices"),
    (dict(name="k", kind="count", summary=3), "summary"), (dict(name="k", kind="count", named="yes"), "named"),
]


def _cli_still_works() -> None:
    from reco_sampled_plugin import cli

    with pytest.raises(SystemExit) as done:
        cli.main(["estimate", "--help"])
    assert done.value.code == 0


@pytest.mark.parametrize("field, value, named", WRONG_ENTRIES)
def test_entries_of_every_wrong_kind_are_refused_at_registration(field, value, named):
    """One field wrong at a time: a ValueError naming it, at construction or registration (never later, elsewhere),
    and the registry as it was."""
    before = registry.names()
    with pytest.raises(ValueError, match=f"^{named}: "):
        registry.register(Estimator(**{**GOOD, "name": "probe_bad", field: value}))
    assert registry.names() == before


@pytest.mark.parametrize("kwargs, named", WRONG_OPTIONS)
def test_options_of_every_wrong_kind_are_refused_at_construction(kwargs, named):
    with pytest.raises(ValueError, match=f"^{named}: "):
        Option(**kwargs)


def test_a_refused_entry_leaves_the_cli_working_and_a_good_one_reaches_it(capsys):
    for field, value, _ in WRONG_ENTRIES[:12]:
        with pytest.raises(ValueError):
            registry.register(Estimator(**{**GOOD, "name": "probe_bad", field: value}))
    _cli_still_works()
    registry.register(Estimator(**GOOD))
    try:
        _cli_still_works()
        assert "probe_ok" in capsys.readouterr().out
        assert rsp.estimate("auc", SAMPLE, method="probe_ok").value == 0.5
    finally:
        registry.unregister("probe_ok")


#: Values of each option kind that its check accepts (a default drawn from them is valid).
_GOOD_VALUES = {"fraction": st.floats(0, 1), "positive_float": st.floats(1e-6, 1e6), "count": st.integers(1, 2**40),
                "count0": st.integers(0, 2**40), "bootstrap": st.integers(0, 2000), "iterations": st.integers(1, 10**6),
                "spline_df": st.integers(4, 4096), "seed": st.integers(0, 2**63 - 1), "bool": st.booleans(),
                "nonnegative_float": st.floats(0, 1e6), "base_measure": st.floats(0, 2)}
_OPTION = st.tuples(st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True), st.sampled_from(sorted(_GOOD_VALUES))).flatmap(
    lambda t: _GOOD_VALUES[t[1]].map(lambda v: Option(t[0], t[1], v)))


@settings(max_examples=examples(25), deadline=None)
@given(name=st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True), options=st.lists(_OPTION, max_size=3,
       unique_by=lambda o: o.name), field=st.sampled_from([None, "compute", "options", "name"]))
def test_random_entries_register_and_one_wrong_field_is_refused(name, options, field):
    """Random valid entries (names, options of every kind with defaults of their kind) register and estimate;
    the same entry with one field made wrong is refused naming it, the registry unchanged."""
    import keyword

    options = tuple(o for o in options if o.name not in registry.COMMON_OPTIONS + ("entry", "name", "options", "given"))
    if keyword.iskeyword(name) or name in registry.names():
        return
    before = registry.names()
    wrong = {None: {}, "compute": {"compute": ".corrections:" + name + "_missing"},
             "options": {"options": options + (Option("bad_default", "count", 0),)}, "name": {"name": name + " x"}}[field]
    if field is not None:
        with pytest.raises(ValueError, match=f"^{'bad_default' if field == 'options' else field}: "):
            registry.register(Estimator(**{**GOOD, "name": name, "options": options, **wrong}))
        assert registry.names() == before
        return
    registry.register(Estimator(**{**GOOD, "name": name, "options": options}))
    try:
        assert name in registry.names() and registry.method_class(name)().options() == {o.name: o.default
                                                                                          for o in options}
        assert rsp.estimate("auc", SAMPLE, method=name).value == 0.5
    finally:
        registry.unregister(name)
    assert registry.names() == before


def test_every_builtin_entry_passes_the_registration_checks():
    for entry in registry.entries():
        registry.check_entry(entry)


# ------------------------------------------------------------------------------------ what compute functions return
class _Ident:
    """An identification whose interval is given (lo, hi)."""

    def __init__(self, lo, hi, metric_range=(0.0, 1.0)):
        self.lo, self.hi, self.metric_range = lo, hi, metric_range

    def interval(self, level=0.95):
        return self


class _NoInterval:
    metric_range = (0.0, 1.0)


#: Every wrong kind of each field of a compute function's output (the others valid).
WRONG_OUTPUTS = [
    ("value", math.nan), ("value", math.inf), ("value", -math.inf), ("value", "0.5"), ("value", True), ("value", None),
    ("value", 1j), ("value", np.array([0.5, 0.2])), ("value", torch.tensor([0.5, 0.2])),
    ("stderr", -0.1), ("stderr", math.nan), ("stderr", "0.1"), ("stderr", False), ("stderr", -math.inf),
    ("n_instances", -5.0), ("n_instances", math.nan), ("n_instances", math.inf), ("n_instances", "200"),
    ("details", [1]), ("details", None), ("flags", "bad"), ("flags", (1,)), ("flags", None),
    ("identification", _NoInterval()), ("identification", _Ident(0.6, 0.4)), ("identification", _Ident(math.nan, 0.4)),
    ("identification", _Ident(0.2, "0.4")), ("identification", object()),
    ("twin_gap", (0.1,)), ("twin_gap", (-0.1, 0.1)), ("twin_gap", (math.nan, 0.1)), ("twin_gap", (0.1, math.inf)),
    ("whole", None), ("whole", 0.5), ("whole", (0.5, 0.01)),
]


def _output(field, value, total):
    if field == "whole":
        return value
    out = dict(value=0.5, stderr=0.01, n_instances=total, details={}, flags=(), identification=None)
    if field == "twin_gap":
        out["details"] = {"twin_gap": value}
    else:
        out[field] = value
    return EstimatorOutput(**out)


def _run_with_output(make):
    def compute(spec, hist, *, method, sampling, options):
        return make(hist.total)

    registry.register(Estimator("probe_out", "correction", "returns what it is told", compute), replace=True)
    try:
        return rsp.estimate("auc", SAMPLE, method="probe_out")
    finally:
        registry.unregister("probe_out")


@pytest.mark.parametrize("field, value", WRONG_OUTPUTS)
def test_compute_functions_returning_every_wrong_kind_are_refused_before_an_estimate(field, value):
    with pytest.raises(ValueError, match="^compute: estimator 'probe_out' returned"):
        _run_with_output(lambda total: _output(field, value, total))


@settings(max_examples=examples(30), deadline=None)
@given(value=st.floats(-2, 3), stderr=st.one_of(st.floats(0, 10), st.just(math.inf), st.none()),
       ident=st.one_of(st.none(), st.tuples(st.floats(0, 1), st.floats(0, 1)).map(sorted)))
def test_valid_compute_outputs_give_an_honest_estimate(value, stderr, ident):
    """What passes the check gives an Estimate whose interval is ordered, never NaN, and holds its value up to
    float64 rounding at the range's ends (1e-12: such a value is on the range, moved onto it unflagged), or flags it
    outside the metric's range; no standard error is the fit's refusal, as before."""
    def make(total):
        return EstimatorOutput(value, stderr, total, {}, (), None if ident is None else _Ident(*ident))

    if stderr is None:
        with pytest.raises(ValueError, match="^estimate: no standard error"):
            _run_with_output(make)
        return
    est = _run_with_output(make)
    lo, hi = est.interval(0.95)
    assert not (math.isnan(lo) or math.isnan(hi)) and lo <= hi
    assert lo - 1e-12 <= value <= hi + 1e-12 or "outside_metric_range" in est.flags


# ----------------------------------------------------------------------------------------------- query filters
@pytest.mark.parametrize("kwargs, named", [
    (dict(family=3), "family"), (dict(family="nope"), "family"), (dict(family=("mapping", "nope")), "family"),
    (dict(family=()), "family"), (dict(family={"mapping"}), "family"), (dict(adaptive="yes"), "adaptive"),
    (dict(adaptive=1), "adaptive"), (dict(fits_distribution=1), "fits_distribution"),
    (dict(fits_distribution="no"), "fits_distribution"), (dict(design=5), "design"), (dict(design="m=10"), "design"),
    (dict(metric=3), "metric"), (dict(metric="bogus@3"), "metric"),
])
def test_query_filters_check_their_arguments(kwargs, named):
    with pytest.raises(ValueError, match=f"^{named}: "):
        registry.names(**kwargs)


@pytest.mark.parametrize("name", [["bv"], {"bv": 1}, None, 3, b"bv"], ids=["list", "dict", "None", "int", "bytes"])
def test_unregister_refuses_what_is_not_a_name(name):
    """A list or a dict would fail as an unhashable key, None or a number would remove nothing silently."""
    with pytest.raises(ValueError, match="^name: expected an estimator's name"):
        registry.unregister(name)
    assert "bv" in registry.names()


def test_popularity_auto_checks_its_design():
    with pytest.raises(ValueError, match="^design: expected a SamplingDesign"):
        registry.popularity_auto("auc", design=5)
    assert registry.popularity_auto("auc", SamplingDesign(10, popularity=torch.ones(5))) == "hh"


def test_query_filters_still_select():
    assert registry.names(family=["mapping"]) == registry.names(family="mapping") == ("linear", "bound", "beta",
                                                                                      "beta_fit")
    assert set(registry.names(design=SamplingDesign(10, popularity=torch.ones(5)), metric="auc")) >= {"hh", "none"}
    assert registry.names(adaptive=np.bool_(True)) == registry.names(adaptive=True)


def test_diff_replaced_without_coef_leaves_exact_shares_working():
    """diff's lambda choices are module constants: a user's replacement of the entry (here one without a coef option)
    registered before anything draws an exact share changes nothing of the draws (a fresh process: the import order)."""
    import subprocess
    import sys

    code = (
        "import dataclasses, torch\n"
        "import reco_sampled_plugin as rsp\n"
        "from reco_sampled_plugin import registry\n"
        "from reco_sampled_plugin.design import ExactShare\n"
        "bv = registry.get('bv')\n"
        "registry.register(dataclasses.replace(bv, name='diff'), replace=True)\n"
        "g = torch.Generator().manual_seed(0)\n"
        "scores = torch.randn(20, 300, generator=g)\n"
        "pos = torch.zeros(20, 300, dtype=torch.bool); pos[:, 0] = True\n"
        "s = rsp.sampled_ranks(scores, pos, rsp.SamplingDesign(50, exact_share=ExactShare(0.5)))\n"
        "from reco_sampled_plugin import _design_based\n"
        "print(s.share_ranks is not None, _design_based.COEF, _design_based.COEFS)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "one", "('one',", "'tuned')"]
