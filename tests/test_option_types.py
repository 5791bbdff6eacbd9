"""Options of the wrong type, and messages that name the argument.

Class 5: every option of every public entry point (the table in tests/_option_table.py, options read from
``inspect.signature`` and typed by their annotations) refuses a wrong-typed value with a ValueError that names
it: a bool option takes True/False (numpy bools too), never ``"False"`` (truthy: it did what True does), 0/1 or a
one-element array; a float option refuses ``"0.5"`` and bools; an int option refuses 2.0, ``"3"`` and bools; a name
list refuses an int and reads one string as one name. Class 4: metric lists given as a string or an int, scipy
sparse scores and factors, None sizes, NaN ranks in ``fit_beta_prior``, string timestamps and bad column specs.
"""

from __future__ import annotations

import math
import tempfile

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reco_sampled_plugin as rsp
from reco_sampled_plugin.corrections import correction_table, expected_corrected
from reco_sampled_plugin.mapping import mapping
from reco_sampled_plugin.priors import empirical_prior, fit_beta_prior
from reco_sampled_plugin.rank_distribution import fit_rank_distribution
from _option_table import _Config, entries, wrong_values

_TMP = tempfile.mkdtemp(prefix="rsp-option-types-")
ENTRIES = {e.name: e for e in entries(_TMP)}
CASES = [(name, opt) for name, e in ENTRIES.items() for opt in e.options()]


def _refused(entry, option: str, value) -> None:
    """``entry`` called with ``option=value`` raises a ValueError whose message names ``option``."""
    with pytest.raises(ValueError) as err:
        entry.call(**{option: value})
    assert option in str(err.value), f"{entry.name}({option}={value!r}): message does not name it: {err.value}"


# ---------------------------------------------------------------------------------- the table itself
def test_the_table_covers_every_public_entry_point_with_options():
    """Every callable of the package catalogue that takes a keyword option is in the table (a new entry point
    with options fails here until it is added), and the table fuzzes at least one option of each entry."""
    import inspect

    covered = {e.fn for e in ENTRIES.values()}
    missing = []
    for name in rsp.__all__:
        obj = getattr(rsp, name)
        # register: its one option (replace) is pinned below, as a call registers; SampledRanks, ScoringCost: result
        # types (built by the draws, not by users); as_design: its one option (name) is the argument name its
        # messages use, set by the package (its design argument: tests/test_entry_point_probe.py)
        if not callable(obj) or isinstance(obj, type(rsp)) or name in ("register", "SampledRanks", "ScoringCost",
                                                                          "as_design"):
            continue
        try:
            params = inspect.signature(obj).parameters.values()
        except (TypeError, ValueError):
            continue
        from _option_table import DATA, option_kind

        if any(p.default is not inspect.Parameter.empty and p.name not in DATA and option_kind(p)[0] for p in params):
            if obj not in covered:
                missing.append(name)
    assert not missing, f"public entry points with options missing from tests/_option_table.py: {missing}"
    assert all(e.options() for e in ENTRIES.values()), [n for n, e in ENTRIES.items() if not e.options()]
    assert len(CASES) > 150


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_each_table_entry_is_a_valid_call(name):
    """The positive control: the base call of every entry works, so a refusal below is the option's."""
    ENTRIES[name].call()


# ---------------------------------------------------------------------------------- class 5: every option
@pytest.mark.parametrize("name,option", CASES, ids=[f"{n}-{o}" for n, o in CASES])
def test_every_option_refuses_wrong_types_naming_itself(name, option):
    entry = ENTRIES[name]
    kind, none_ok = entry.options()[option]
    for value in wrong_values(kind, none_ok):
        _refused(entry, option, value)


# the valid values of each kind that must keep working (numpy scalars included): the helpers are not too strict
VALID = {
    "bool": [np.bool_(False), True],
    "bool|str": [np.bool_(True), False],
}


# RecBole's rsp_replacement in the table's uni100 mode: False is refused for what it means (uni100 draws with
# replacement), not for its type, so its valid values are not all accepted there
_BOOL_CASES = [c for c in CASES if ENTRIES[c[0]].options()[c[1]][0] in VALID and c != ("recbole", "rsp_replacement")]


@pytest.mark.parametrize("name,option", _BOOL_CASES, ids=[f"{n}-{o}" for n, o in _BOOL_CASES])
def test_bool_options_take_python_and_numpy_bools(name, option):
    entry = ENTRIES[name]
    for value in VALID[entry.options()[option][0]]:
        try:
            entry.call(**{option: value})
        except ValueError as exc:  # a bool may be refused for what it means (not its type): never as a type
            assert "expected" not in str(exc) or "True" not in str(exc) and "true" not in str(exc), exc


def _wrong(kind: str, none_ok: bool):
    """Wrong-typed values of an option kind, beyond the fixed lists: any text, bools for numbers, floats for ints,
    lists, complex numbers, arrays."""
    text = st.text(max_size=6)
    arrays = st.builds(lambda v, k: np.full(k, v), st.floats(0.1, 2), st.integers(2, 3))
    # a size may be one number in a one-element list or tensor (check_size): two numbers are never one size
    common = [st.lists(st.integers(1, 5), min_size=2 if kind == "size" else 1, max_size=2), arrays, st.complex_numbers(max_magnitude=5).filter(
        lambda z: z.imag != 0)] + ([] if none_ok else [st.none()])
    by_kind = {
        "bool": [text, st.integers(), st.floats(allow_nan=True)],
        "float": [text, st.booleans(), st.binary(min_size=1, max_size=3)],
        "int": [text, st.booleans(), st.floats(allow_nan=True, allow_infinity=True)],
        "size": [text, st.booleans(), st.floats(allow_nan=True).filter(lambda x: not float(x).is_integer())],
        "str": [st.integers(), st.floats(), st.booleans(), st.lists(text, min_size=1, max_size=2)],
        "bool|str": [text.filter(lambda s: s != "positives"), st.integers(), st.floats()],
        "names": [st.integers(), st.floats(), st.booleans(), st.binary(min_size=1, max_size=3),
                  st.lists(st.integers(), min_size=1, max_size=2)],
    }
    return st.one_of(*by_kind[kind], *(common if kind != "names" else common[2:]))


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much], deadline=None)
@given(data=st.data(), case=st.sampled_from(CASES))
def test_fuzz_wrong_typed_options(data, case):
    """Any wrong-typed value of any option of any entry point: a ValueError naming the option."""
    name, option = case
    entry = ENTRIES[name]
    kind, none_ok = entry.options()[option]
    value = data.draw(_wrong(kind, none_ok), label=f"{name}({option}=...)")
    _refused(entry, option, value)


# ----------------------------------------------------------------- class 5: the cases that went wrong silently
def test_count_other_positives_string_is_refused_and_the_bools_give_the_right_ranks():
    # scores 0.9 (item 0), 0.8 (item 1), 0.1 (item 2), 0.5 (item 3); positives items 1 and 2
    scores = torch.tensor([[0.9, 0.8, 0.1, 0.5]])
    pos = torch.tensor([[1, 2]])
    with pytest.raises(ValueError, match="^count_other_positives: expected True or False, got 'False'"):
        rsp.exact_ranks(scores, pos, count_other_positives="False")
    # brute force: item 2 is beaten by items 0, 1, 3 (all candidates) or by 0, 3 (irrelevant only)
    assert rsp.exact_ranks(scores, pos, count_other_positives=True).tolist() == [[2, 4]]
    assert rsp.exact_ranks(scores, pos, count_other_positives=np.bool_(False)).tolist() == [[2, 3]]
    with pytest.raises(ValueError, match="^count_other_positives: "):
        rsp.candidate_counts(4, pos, None, count_other_positives=1)
    assert rsp.candidate_counts(4, pos, None, count_other_positives=False).tolist() == [3]


def test_replacement_string_is_refused_and_false_draws_distinct_items():
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(50, 12, generator=g)
    pos = torch.zeros(50, dtype=torch.int64)
    for bad in ("no", "False", 0, None):
        with pytest.raises(ValueError, match="^replacement: "):
            rsp.sampled_ranks(scores, pos, rsp.SamplingDesign(11, replacement=bad), generator=g)
    out = rsp.sampled_ranks(scores, pos, rsp.SamplingDesign(11, replacement=False), generator=g)
    neg = out.negatives.reshape(50, 11)
    # without replacement, 11 draws from the 11 irrelevant items are exactly those items: the exact rank
    assert all(sorted(row) == list(range(1, 12)) for row in neg.tolist())
    assert torch.equal(out.ranks, rsp.exact_ranks(scores, pos.unsqueeze(1)))
    assert out.design.replacement is False


def test_gamma_string_is_refused_everywhere_estimate_refuses_it():
    r = torch.tensor([1, 2, 3, 1, 5])
    with pytest.raises(ValueError, match="^gamma: "):
        rsp.estimate("ndcg@5", rsp.SampledRanks.from_arrays(r, 100, 10), rsp.registry.Bv(gamma="0.5"))
    for call in (lambda g: correction_table("ndcg@5", 100, 10, rsp.registry.Bv(gamma=g)),
                 lambda g: expected_corrected("ndcg@5", torch.tensor([1, 5]), 100, 10, rsp.registry.Bv(gamma=g)),
                 lambda g: rsp.estimate("ndcg@5", rsp.SampledRanks.from_arrays(r, 100, 10), rsp.registry.Bv(gamma=g)),
                 lambda g: rsp.paired_difference("ndcg@5", r, r.flip(0), 100, 10, rsp.registry.Bv(gamma=g))):
        for bad in ("0.5", True, b"0.5"):
            with pytest.raises(ValueError, match="^gamma: "):
                call(bad)
    # a numpy float is a float: the same table as the Python float
    assert torch.equal(correction_table("ndcg@5", 100, 10, rsp.registry.Bv(gamma=np.float64(0.5))),
                       correction_table("ndcg@5", 100, 10, rsp.registry.Bv(gamma=0.5)))


def test_bv_label_of_the_consistency_methods_still_parses_its_number():
    """"bv:0.01" is text: its gamma is parsed there, then checked like every gamma (a str gamma is refused)."""
    from reco_sampled_plugin.consistency import parse_method

    assert parse_method("bv:0.01") == rsp.registry.Bv(gamma=0.01)
    with pytest.raises(ValueError, match="^method: 'bv:<gamma>'"):
        parse_method("bv:x")
    with pytest.raises(ValueError, match="^gamma: "):
        parse_method("bv:1.5")


def test_planner_target_string_is_refused():
    from reco_sampled_plugin.planner import plan

    for bad in ("0.05", True, [0.05]):
        with pytest.raises(ValueError, match="^target_rel_error: "):
            plan(1000, 100, "ndcg@10", bad)


def test_recbole_numbers_and_bools_are_read_strictly():
    from reco_sampled_plugin.adapters._recbole_settings import validate_config

    base = dict(metrics=["CorrectedRecall"], eval_args={"mode": "uni100"}, topk=[10], rsp_estimators=["bv", "auto"])
    for key, bad in (("rsp_n_grid", False), ("rsp_stderr", "false"), ("rsp_interval", 1), ("rsp_seed", "3")):
        with pytest.raises(ValueError, match=f"^{key}: "):
            validate_config(_Config({**base, key: bad}))
    # the estimators' options: read as strictly by their method objects, named under rsp_estimator_options
    for method, option, bad in (("bv", "gamma", True), ("bv", "gamma", "0.5"), ("auto", "n_bootstrap", 8.0),
                                ("bv", "prior", ["beta", "2"])):
        with pytest.raises(ValueError, match=f"^rsp_estimator_options: {method}: {option}: "):
            validate_config(_Config({**base, "rsp_estimator_options": {method: {option: bad}}}))
    s = validate_config(_Config({**base, "rsp_estimator_options": {"bv": {"gamma": np.float64(0.5),
                                                                           "prior": ["beta", 2]}}, "topk": 5}))
    bv = s.methods["corrected"]
    assert (bv.gamma, bv.prior, s.topk) == (0.5, ("beta", 2.0), (5,))
    for bad in ("10", [10.5], [True]):
        with pytest.raises(ValueError, match="^topk: "):
            validate_config(_Config({**base, "topk": bad}))
    for key, bad in (("metric_decimal_place", "4"), ("metric_decimal_place", 4.5), ("eval_args", "uni100"),
                     ("eval_args.mode", 3)):
        conf = {**base, "eval_args": {"mode": bad}} if key == "eval_args.mode" else {**base, key: bad}
        with pytest.raises(ValueError, match=f"^{key}: "):
            validate_config(_Config(conf))


def test_mapping_a_is_checked_and_refused_where_unused():
    assert mapping(3, 100, 10, "beta", a=np.float64(1.0)) == mapping(3, 100, 10, "beta", a=1.0)
    with pytest.raises(ValueError, match="^a: "):
        mapping(3, 100, 10, "bound", a=1.0)  # ignored before: now named with the methods that use it
    with pytest.raises(ValueError, match="^a: "):
        mapping(3, 100, 10, "beta", a="1")


def test_top_shape_refuses_bools_and_keeps_ints_as_floats():
    assert rsp.TopShape(gamma=1) == rsp.TopShape(gamma=1.0)
    with pytest.raises(ValueError, match="^shape: gamma "):
        rsp.TopShape(gamma=True)


# ---------------------------------------------------------------------------------- class 4: name the argument
def test_one_metric_name_is_one_metric_not_its_letters():
    g = torch.Generator().manual_seed(1)
    scores, pos = torch.rand(5, 20, generator=g), torch.tensor([[1], [2], [3], [4], [5]])
    one = rsp.per_user_metrics(scores, pos, "ndcg@5", as_frame=False)
    listed = rsp.per_user_metrics(scores, pos, ["ndcg@5"], as_frame=False)
    assert list(one) == list(listed) == ["NDCG@5"] and torch.equal(one["NDCG@5"], listed["NDCG@5"])
    ranks = rsp.exact_ranks(scores, pos).reshape(-1).double()
    oracle = torch.where(ranks <= 5, 1 / torch.log2(ranks + 1), torch.zeros_like(ranks))  # one relevant item
    assert torch.allclose(one["NDCG@5"], oracle)
    fit = fit_rank_distribution(rsp.SampledRanks.from_arrays(torch.tensor([1, 2, 1, 4, 3]), 100, 10))
    assert list(fit.metrics("ndcg@5")) == ["ndcg@5"] and fit.values("ndcg@5").shape == (1,)
    report = rsp.consistency_report({"a": torch.tensor([1, 5]), "b": torch.tensor([2, 9])}, 50, 10, metrics="ndcg@5",
                                    methods="none", repeats=0)
    assert [row["metric"] for row in report["table3"]] == ["ndcg@5", "ndcg@5"]


@pytest.mark.parametrize("bad", [3, 3.5, b"ndcg@5", [3], ["ndcg@5", None]])
def test_a_metric_list_of_the_wrong_type_names_metrics(bad):
    from reco_sampled_plugin.adapters import lightning, torchmetrics as tm
    from reco_sampled_plugin.adapters._recbole_settings import validate_config
    from reco_sampled_plugin.corrections import correction_tables
    import importlib

    mapping_tables = importlib.import_module("reco_sampled_plugin.mapping").mapping_tables
    fit = fit_rank_distribution(rsp.SampledRanks.from_arrays(torch.tensor([1, 2, 1, 4, 3]), 100, 10))
    calls = [
        lambda: rsp.per_user_metrics(torch.rand(2, 10), torch.tensor([1, 2]), bad),
        lambda: rsp.per_user_metrics((torch.rand(2, 3), torch.rand(10, 3)), torch.tensor([1, 2]), bad),
        lambda: tm.ExactRankingMetrics(bad),
        lambda: tm.SampledRankingMetrics(bad, 10),
        lambda: lightning.RankingSettings(bad),
        lambda: validate_config(_Config(metrics=bad, eval_args={"mode": "uni100"}, topk=[10])),
        lambda: fit.metrics(bad),
        lambda: fit.values(bad),
        lambda: correction_tables(bad, 100, 10),
        lambda: mapping_tables(bad, 100, 10),
        lambda: rsp.consistency_report({"a": torch.tensor([1, 5])}, 50, 10, metrics=bad, repeats=0),
        lambda: rsp.consistency_report({"a": torch.tensor([1, 5])}, 50, 10, metrics=bad, repeats=2),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="^metrics: "):
            call()


def test_scipy_sparse_scores_and_factors_are_named():
    s = sp.random(3, 10, density=0.5, format="csr", random_state=0)
    pos = torch.tensor([[1], [2], [3]])
    from reco_sampled_plugin.adapters import torchmetrics as tm

    for call, name in ((lambda: rsp.exact_ranks(s, pos), "scores"),
                       (lambda: rsp.sampled_ranks(s, pos, 3), "scores"),
                       (lambda: rsp.per_user_metrics(s, pos, ["ndcg@5"]), "scores"),
                       (lambda: tm.ExactRankingMetrics(["ndcg@5"]).update(s, pos), "scores"),
                       (lambda: rsp.exact_ranks_from_factors(sp.random(3, 4, density=0.5), torch.rand(10, 4), pos),
                        "user_factors"),
                       (lambda: rsp.per_user_metrics((torch.rand(3, 4), sp.random(10, 4, density=0.5)),
                                                     pos, ["ndcg@5"]), "item_factors"),
                       (lambda: rsp.evaluate_factors(None, sp.eye(3, 10, format="csr"), sp.random(3, 4, density=0.5),
                                                     torch.rand(10, 4)), "user_factors"),
                       (lambda: rsp.exact_ranks(torch.rand(3, 10).to_sparse(), pos), "scores")):
        with pytest.raises(ValueError, match=f"^{name}: expected a dense matrix"):
            call()


def test_plan_names_ragged_catalogue_sizes():
    """Per-user sizes as a ragged list are refused naming ``n_items`` (numpy's own 'inhomogeneous shape' error)."""
    from reco_sampled_plugin.planner import plan

    with pytest.raises(ValueError, match="^n_items: expected whole numbers"):
        plan([[1, 2], [3]], 2, "ndcg@10", 0.2)


@pytest.mark.parametrize("bad", [None, "100", True, 10.5])
def test_none_and_other_non_sizes_are_named(bad):
    ex, sr = torch.tensor([1, 3, 10]), torch.tensor([1, 2, 3, 1])
    from reco_sampled_plugin.planner import plan

    for call in (lambda: rsp.consistency_report({"a": ex, "b": ex}, bad, 5, repeats=0),
                 lambda: rsp.consistency_report({"a": ex, "b": ex}, bad, 5, repeats=2),
                 lambda: empirical_prior(ex, bad),
                 lambda: mapping(3, bad, 10),
                 lambda: correction_table("ndcg@5", bad, 10),
                 lambda: plan(bad, 10, "ndcg@5", 0.1)):
        with pytest.raises(ValueError, match="^n_items: "):
            call()
    for call in (lambda: fit_beta_prior(sr, bad), lambda: rsp.estimate(
        "ndcg@5",
        rsp.SampledRanks.from_arrays(sr, 100, bad),
        "bv",
    ),
                 lambda: rsp.estimate("ndcg@5", rsp.SampledRanks.from_arrays(sr, 100, bad))):
        with pytest.raises(ValueError, match="^n_samples: "):
            call()


def test_consistency_n_items_per_instance_must_match():
    ex = torch.tensor([1, 3, 10])
    with pytest.raises(ValueError, match=r"^n_items: give one count or one per instance \(3\)"):
        rsp.consistency_report({"a": ex}, [100, 200], 5, repeats=0)
    per_instance = rsp.consistency_report({"a": ex}, [100, 100, 100], 5, repeats=0)
    assert per_instance["table3"] == rsp.consistency_report({"a": ex}, 100, 5, repeats=0)["table3"]


def test_fit_beta_prior_nan_ranks_are_named_and_valid_ranks_give_the_moment_fit():
    with pytest.raises(ValueError, match="^sampled_ranks: contains NaN"):
        fit_beta_prior(torch.tensor([1.0, math.nan]), 10)
    with pytest.raises(ValueError, match="^sampled_ranks: "):
        fit_beta_prior(torch.tensor([True, False]), 10)
    # method of moments: mu = mean((r~ - 1)/m) = (0 + 5 + 10) / 3 / 10 = 0.5 -> a = mu / (1 - mu) = 1
    assert fit_beta_prior(torch.tensor([1, 6, 11]), 10).a == pytest.approx(1.0)


def test_string_timestamps_are_named_not_parsed():
    from reco_sampled_plugin.datasets import Interactions, leave_last_out

    X = sp.csr_matrix(np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]]))
    for bad in (np.array(["3", "1", "2", "9"]), ["2020", "2021", "2022", "2023"], np.array([1, 2, 3, 4]) + 0j,
                np.array([True, False, True, False])):
        with pytest.raises(ValueError, match="^timestamps: expected real numbers"):
            rsp.leave_last_out_split(X, bad)
    # numbers work, and "10" after "9" in time (text order would put it first)
    train, test = rsp.leave_last_out_split(X, np.array([10.0, 9.0, 1.0, 2.0]))
    assert test.toarray().tolist() == [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
    inter = Interactions(user=np.array([0, 0]), item=np.array([0, 1]), rating=None,
                         timestamp=np.array(["10", "9"]), user_ids=np.array(["u"]), item_ids=np.array(["a", "b"]))
    with pytest.raises(ValueError, match="^timestamp: expected real numbers"):
        leave_last_out(inter)


def test_bad_column_specs_and_separators_are_named(tmp_path):
    from reco_sampled_plugin.datasets import binarize, load_interactions

    path = tmp_path / "r.csv"
    path.write_text("1,10,5,100\n1,11,3,101\n2,10,4,102\n")
    for bad in ((0, 1), (0, "1", None, None), (0, 1.0, None, None), (0, 0, None, None), "0123", 3, (None, 1, 2, 3),
                (0, 1, -1, None), (0, 1, True, None)):
        with pytest.raises(ValueError, match="^columns: "):
            load_interactions(path, columns=bad)
    for bad in ("", 1, b","):
        with pytest.raises(ValueError, match="^sep: "):
            load_interactions(path, sep=bad)
    with pytest.raises(ValueError, match="^header: "):
        load_interactions(path, header="no")
    inter = load_interactions(path, columns=(1, 0, None, 3))  # users and items swapped, no rating
    assert inter.user_ids.tolist() == ["10", "11"] and inter.rating is None
    assert inter.timestamp.tolist() == [100.0, 101.0, 102.0]
    rated = load_interactions(path)
    for bad in ("4", True, math.nan):
        with pytest.raises(ValueError, match="^threshold: "):
            binarize(rated, bad)
    assert len(binarize(rated, np.float64(4.0))) == 2  # ratings 5 and 4


def test_reproduce_config_list_options_are_checked():
    from reco_sampled_plugin.reproduce import ReproduceConfig, _checked_config

    for key, bad in (("m_grid", 10), ("m_grid", [10, 2.5]), ("m_grid", "10"), ("metrics", 3), ("methods", [1]),
                     ("n_spread", "0.02"), ("repeats", 1), ("data", 3)):
        with pytest.raises(ValueError, match=f"^{key}: "):
            _checked_config(ReproduceConfig(**{key: bad}))
    cfg = _checked_config(ReproduceConfig(metrics="ndcg@10", m_grid=[10, np.int64(20)]))
    assert cfg.metrics == ("ndcg@10",) and cfg.m_grid == (10, 20)


def test_recbole_entry_points_take_bools_only():
    from reco_sampled_plugin.adapters import recbole as plugin

    for bad in ("no", "False", 0):
        with pytest.raises(ValueError, match="^compat: "):
            plugin.register(compat=bad)
        with pytest.raises(ValueError, match="^saved: "):
            plugin.run_recbole("BPR", "ml-100k", saved=bad)
    assert plugin.registered()


def test_registry_flags_and_replace_take_bools_only():
    from reco_sampled_plugin import registry

    with pytest.raises(ValueError, match="^adaptive: "):
        registry.Estimator("x", "correction", "s", "m:f", adaptive="False")
    assert registry.Estimator("x", "correction", "s", "m:f", adaptive=np.bool_(True)).adaptive is True
    with pytest.raises(ValueError, match="^replace: "):
        registry.register(registry.get("bv"), replace="yes")


def _numpy_default_cases():
    """(entry, option, numpy value) for every float / int option with a numeric default: its numpy twin."""
    import inspect

    out = []
    for name, entry in ENTRIES.items():
        params = inspect.signature(entry.fn).parameters
        for option, (kind, _) in entry.options().items():
            d = params[option].default if option in params else None
            if kind == "float" and isinstance(d, float):
                out.append((name, option, np.float64(d)))
            elif kind == "int" and type(d) is int:
                out.append((name, option, np.int64(d)))
    return out


@pytest.mark.parametrize("name,option,value", _numpy_default_cases(),
                         ids=[f"{n}-{o}" for n, o, _ in _numpy_default_cases()])
def test_numpy_twins_of_the_defaults_are_accepted(name, option, value):
    """The helpers are not too strict: a numpy float or int equal to the default is taken as the default is."""
    ENTRIES[name].call(**{option: value})
