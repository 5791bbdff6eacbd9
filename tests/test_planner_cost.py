"""The planner's cost in scored pairs and time: its forecast against the scorer loop's measured
cost, the seconds arithmetic, a scorer-loop pilot that times the plan, ``--seconds-per-pair``, the recommendation,
and a rank file written from a scorer run and estimated back through the CLI."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

import reco_sampled_plugin as rsp
from reco_sampled_plugin import SamplingDesign, cli, sampled_ranks_from_scorer
from reco_sampled_plugin.planner import PlanExecution, plan
from reco_sampled_plugin.rank_files import read_rank_file, write_rank_file


class MatrixScorer:
    """A scorer reading a materialised (B, n) matrix by user id (as tests/test_scorer_ranks.py's)."""

    def __init__(self, scores: torch.Tensor) -> None:
        self.scores = scores

    def __call__(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return self.scores[users.unsqueeze(1).expand_as(items), items]


def default_family_ranks(n: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """Exact ranks from the planner's default family, drawn here independently of the planner: with probability
    1/2 P(R) proportional to 1/R on 1..n (inverse cdf on the explicit cumulative sum), else uniform on 1..n."""
    cdf = np.cumsum(1.0 / np.arange(1, n + 1))
    cdf /= cdf[-1]
    zipf = np.minimum(np.searchsorted(cdf, rng.random(size), side="right") + 1, n)
    uniform = rng.integers(1, n + 1, size)
    return np.where(rng.random(size) < 0.5, zipf, uniform)


def matrix_with_ranks(exact: np.ndarray, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores (B, n), positives (B,)): each row a random permutation of the values 0..n-1, the positive the item
    holding value n - R, so exactly R - 1 items score above it (its exact rank is R; no ties)."""
    g = torch.Generator().manual_seed(seed)
    values = torch.rand(len(exact), n, generator=g).argsort(1)
    target = torch.as_tensor(n - exact, dtype=torch.int64).unsqueeze(1)
    positives = (values == target).to(torch.int8).argmax(1)
    return values.to(torch.float64), positives


N, B = 2000, 3000


@pytest.fixture(scope="module")
def default_family_set():
    exact = default_family_ranks(N, B, np.random.default_rng(3))
    scores, positives = matrix_with_ranks(exact, N, seed=4)
    return exact, scores, positives


# --------------------------------------------------------------------------- forecast cost against the loop's cost
@pytest.fixture(scope="module")
def family_plan():
    """``family_plan(design)``: the default family's plan of ``design`` alone on N items and B users (repeats 3,
    seed 1), made on first use and kept for the module (a Plan is frozen): the power test reads the very plan the
    comparison test made for adaptive 5 -> 1280."""
    kept: dict = {}

    def get(design: SamplingDesign):
        key = (design.n_samples, design.replacement, design.adaptive_max)
        assert design == SamplingDesign(design.n_samples, replacement=design.replacement,
                                        adaptive_max=design.adaptive_max)  # the key is the whole design
        if key not in kept:
            kept[key] = plan(N, B, "ndcg@10", 0.5, designs=[design], repeats=3, seed=1)
        return kept[key]

    return get


@pytest.mark.parametrize("design", [SamplingDesign(40), SamplingDesign(40, replacement=False),
                                    SamplingDesign(20, adaptive_max=640), SamplingDesign(5, adaptive_max=1280)],
                         ids=["m40", "m40-without", "adaptive20-640", "adaptive5-1280"])
def test_forecast_pairs_match_the_loops_measured_pairs(default_family_set, family_plan, design):
    """On users whose exact ranks follow the default family, the plan's expected pairs per positive (under that
    family) equals the scorer loop's measured pairs per positive within 4 standard errors (the loop's users and
    the plan's Monte Carlo); a fixed m costs exactly 1 + m pairs on both sides, and full ranking n."""
    exact, scores, positives = default_family_set
    sampled = sampled_ranks_from_scorer(MatrixScorer(scores), positives, N, design,
                                        generator=torch.Generator().manual_seed(7), max_pairs=20_000)
    cost = sampled.cost
    per_positive = 1 + (sampled.n_samples.double() if sampled.n_samples is not None
                        else torch.full((B,), float(design.n_samples), dtype=torch.float64))
    assert cost.pairs == int(per_positive.sum())  # the record counts the positive and every drawn item once
    assert cost.full_pairs == B * N
    result = family_plan(design)
    (f,) = result.forecasts
    assert result.full_pairs * B == cost.full_pairs
    measured = cost.pairs / B
    if design.adaptive_max is None:
        assert f.pairs == measured == 1 + design.n_samples and f.pairs_se == 0
        return
    se_loop = float(per_positive.std()) / math.sqrt(B)
    tol = 4 * math.hypot(se_loop, f.pairs_se)
    assert abs(f.pairs - measured) <= tol, (f.pairs, measured, tol)
    assert measured > 1.2 * (1 + design.n_samples)  # the stages cost something: the comparison is not trivial


def test_forecast_cost_tells_rank_distributions_apart(family_plan):
    """The comparison has power: a set whose ranks are uniform (few positives rank first, few stages) costs
    clearly less than the default family's forecast, beyond the tolerance the test above allows."""
    exact = np.random.default_rng(5).integers(1, N + 1, B)
    scores, positives = matrix_with_ranks(exact, N, seed=6)
    design = SamplingDesign(5, adaptive_max=1280)
    sampled = sampled_ranks_from_scorer(MatrixScorer(scores), positives, N, design,
                                        generator=torch.Generator().manual_seed(7))
    per_positive = 1 + sampled.n_samples.double()
    (f,) = family_plan(design).forecasts
    tol = 4 * math.hypot(float(per_positive.std()) / math.sqrt(B), f.pairs_se)
    assert f.pairs - sampled.cost.pairs / B > 3 * tol


def test_full_pairs_per_user_with_exclusions():
    """Full ranking scores n minus each user's excluded items: the plan's full_pairs from per-user counts equals
    the loop's full_pairs per user; a fixed design's pairs are 1 + m per user on both sides."""
    g = torch.Generator().manual_seed(8)
    b, n = 400, 600
    picks = torch.stack([torch.randperm(n, generator=g)[:60] for _ in range(b)])
    positives = picks[:, 0]
    exclude = torch.where(torch.rand(b, 59, generator=g) < 0.5, picks[:, 1:], torch.full((b, 59), -1))
    scores = torch.randn(b, n, generator=g, dtype=torch.float64)
    sampled = sampled_ranks_from_scorer(MatrixScorer(scores), positives, n, 30, exclude=exclude, generator=g)
    n_u = sampled.n_candidates.numpy()  # n minus the excluded items (the positive included)
    assert np.array_equal(n_u, n - (exclude >= 0).sum(1).numpy())
    result = plan(n_u, b, "ndcg@10", 0.5, designs=[SamplingDesign(30)], repeats=2, seconds_per_pair=1e-3)
    assert result.full_pairs * b == pytest.approx(sampled.cost.full_pairs, rel=1e-12)
    assert result.forecasts[0].pairs * b == sampled.cost.pairs == b * 31
    assert result.full_scoring_seconds == pytest.approx(sampled.cost.full_pairs * 1e-3, rel=1e-12)


# --------------------------------------------------------------------------------------------- seconds arithmetic
@pytest.fixture(scope="module")
def timed_plan():
    designs = [SamplingDesign(50), SamplingDesign(500), SamplingDesign(100, adaptive_max=3200),
               SamplingDesign(100, adaptive_max=800)]
    return plan(20_000, 1200, "ndcg@10", 0.15, designs=designs, repeats=4, seed=3, seconds_per_pair=2.5e-5,
                execution=PlanExecution(forecast_all=True))


def test_seconds_arithmetic(timed_plan):
    s, users = 2.5e-5, 1200
    assert timed_plan.seconds_per_pair == s and timed_plan.seconds_per_pair_source == "given"
    for f in timed_plan.forecasts:
        assert f.pairs == 1 + f.mean_samples
        assert f.scoring_seconds == pytest.approx(f.pairs * users * s, rel=1e-12)
    assert timed_plan.forecasts[0].scoring_seconds == pytest.approx(51 * 1200 * 2.5e-5, rel=1e-12)  # 1.53 s
    assert timed_plan.full_pairs == 20_000 and timed_plan.full_cost == 19_999
    assert timed_plan.full_scoring_seconds == pytest.approx(20_000 * 1200 * 2.5e-5, rel=1e-12)  # 600 s
    text = timed_plan.format()
    assert "2.5e-05 s per scored pair (given)" in text
    assert "pairs/user" in text and "time" in text
    full_row = next(line for line in text.splitlines() if line.startswith("full ranking"))
    assert "20,000" in full_row and "10.0 min" in full_row and "100.0%" in full_row
    m50_row = next(line for line in text.splitlines() if line.startswith("m = 50 "))
    assert " 51 " in m50_row and "1.53 s" in m50_row


def test_no_times_without_seconds_per_pair():
    result = plan(5000, 300, "hit@10", 0.5, designs=[SamplingDesign(50)], repeats=2)
    assert result.seconds_per_pair is None and result.seconds_per_pair_source is None
    assert math.isnan(result.forecasts[0].scoring_seconds) and math.isnan(result.full_scoring_seconds)
    text = result.format()
    assert "scoring time" not in text and "per scored pair" not in text
    assert "pairs/user" in text


def test_duration_formatting():
    from reco_sampled_plugin.planner import _duration

    assert [_duration(x) for x in (0.0153, 1.53, 59.0, 90.0, 7200.0, 3 * 86400.0, math.nan)] == \
        ["0.0153 s", "1.53 s", "59 s", "1.5 min", "2.0 h", "3.0 d", "-"]


@pytest.mark.parametrize("bad", [0.0, -1e-6, math.nan, math.inf, "1e-5", True, [1e-5]])
def test_bad_seconds_per_pair(bad):
    with pytest.raises(ValueError, match="^seconds_per_pair"):
        plan(5000, 300, "hit@10", 0.5, designs=[SamplingDesign(50)], repeats=2, seconds_per_pair=bad)


# ------------------------------------------------------------------------------------------------ recommendation
def test_recommended_is_cheapest_meeting_target(timed_plan):
    """The recommendation is the design with the fewest pairs (equivalently least predicted time) among those that
    meet the target, at every target between the forecasts' errors: the targets looser than ``timed_plan``'s by
    ``plan``, the tighter ones re-picked from its replicates (``Plan.at_target``: every forecast there ran, so the
    very plan ``plan`` gives there with ``forecast_all=True``; tests/test_planner_prune.py)."""
    errors = sorted(f.rel_error for f in timed_plan.forecasts)
    targets = [e * 1.0001 for e in errors] + [errors[0] / 2]
    fresh = [target > timed_plan.target for target in targets]
    assert any(fresh) and not all(fresh)  # both: plan() itself, and the re-pick
    for target, new in zip(targets, fresh):
        if not new:
            p = timed_plan.at_target(target, target_rel_halfwidth=10.0)
        else:
            p = plan(20_000, 1200, "ndcg@10", target, designs=[f.design for f in timed_plan.forecasts],
                     repeats=4, seed=3, seconds_per_pair=2.5e-5, target_rel_halfwidth=10.0)  # the point target decides
        meeting = [f for f in p.forecasts if f.rel_error <= target]
        if not meeting:
            assert p.recommended is None and "rank all items" in p.format()
            assert "20,000 scored pairs per user, predicted scoring time 10.0 min" in p.recommendation()
            continue
        cheapest = min(meeting, key=lambda f: f.pairs)
        assert p.recommended == cheapest
        assert p.recommended.scoring_seconds == min(f.scoring_seconds for f in meeting)
        assert p.recommended.pairs < p.full_pairs
        rec = p.recommendation()
        assert rec.startswith(f"Recommendation: {cheapest.label} (about {cheapest.pairs:,.0f} scored pairs per user")
        assert "against 10.0 min for full ranking" in rec


# ---------------------------------------------------------------------------------------- a scorer-loop pilot
@pytest.fixture(scope="module")
def pilot_run(default_family_set):
    _, scores, positives = default_family_set
    design = SamplingDesign(25, adaptive_max=800)
    return sampled_ranks_from_scorer(MatrixScorer(scores[:800]), positives[:800], N, design,
                                     generator=torch.Generator().manual_seed(9))


def test_scorer_loop_pilot_gives_shape_and_seconds(pilot_run):
    """A SampledRanks pilot from the scorer loop is the same pilot as SampledRanks built from its ranks, n, final m
    and design (same forecasts), and its measured scorer seconds per pair time the plan."""
    cost = pilot_run.cost
    designs = [SamplingDesign(100), SamplingDesign(50, adaptive_max=1600)]
    got = plan(50_000, 5000, "ndcg@10", 0.2, pilot=pilot_run, designs=designs, repeats=3, seed=2)
    parts = rsp.SampledRanks(pilot_run.ranks, pilot_run.n_candidates, design=SamplingDesign(25, adaptive_max=800),
                             n_samples=pilot_run.n_samples)  # no cost
    ref = plan(50_000, 5000, "ndcg@10", 0.2, pilot=parts, designs=designs, repeats=3, seed=2,
               seconds_per_pair=cost.scorer_seconds / cost.pairs)
    assert got.shape_source == ref.shape_source and got.shape_source.startswith("pilot: mes fit on 800")
    assert "adaptive m = 25->800" in got.shape_source
    assert [(f.rel_error, f.pairs) for f in got.forecasts] == [(f.rel_error, f.pairs) for f in ref.forecasts]
    assert got.seconds_per_pair == cost.scorer_seconds / cost.pairs == ref.seconds_per_pair
    assert got.seconds_per_pair_source.startswith(f"measured on the pilot: {cost.pairs:,} pairs")
    assert [f.scoring_seconds for f in got.forecasts] == [f.scoring_seconds for f in ref.forecasts]
    # a given seconds_per_pair wins over the pilot's
    given = plan(50_000, 5000, "ndcg@10", 0.2, pilot=pilot_run, designs=designs, repeats=3, seed=2,
                 seconds_per_pair=1e-4)
    assert given.seconds_per_pair == 1e-4 and given.seconds_per_pair_source == "given"
    assert given.full_scoring_seconds == pytest.approx(50_000 * 5000 * 1e-4)


def test_matrix_pilot_has_no_seconds_and_padding_is_dropped():
    """A pilot from the score-matrix path (no cost) gives the shape but no times; padded slots are not ranks."""
    g = torch.Generator().manual_seed(10)
    scores = torch.randn(300, 900, generator=g)
    pos = torch.stack([torch.randperm(900, generator=g)[:2] for _ in range(300)])
    pos[::3, 1] = -1
    pilot = rsp.sampled_ranks(scores, pos, 40, generator=g)
    result = plan(900, 300, "hit@10", 0.5, pilot=pilot, designs=[SamplingDesign(50)], repeats=2)
    assert result.seconds_per_pair is None
    assert result.shape_source.startswith(f"pilot: mes fit on {int((pos >= 0).sum()):,} sampled ranks")


def test_popularity_pilot_needs_its_own_catalogue():
    """A popularity pilot's world is its own users (tests/test_planner_popularity.py): another catalogue size is
    refused, naming n_items."""
    g = torch.Generator().manual_seed(11)
    scores = torch.randn(50, 200, generator=g)
    pilot = rsp.sampled_ranks(scores, torch.arange(50), SamplingDesign(20, popularity=torch.rand(200, generator=g)),
                              generator=g)
    with pytest.raises(ValueError, match="^n_items: with a popularity pilot .* give the catalogue its weights cover, "
                                         "200, not 5000"):
        plan(5000, 300, "hit@10", 0.5, pilot=pilot, designs=[SamplingDesign(50)], repeats=2)


# ---------------------------------------------------------------------------------------------------- the CLI
PLAN_ARGS = ["plan", "--n-items", "20000", "--n-users", "1200", "--metric", "ndcg@10", "--target-rel-error", "0.15",
             "--design", "50", "--design", "100:3200", "--repeats", "2"]


def test_cli_seconds_per_pair(capsys):
    assert cli.main(PLAN_ARGS + ["--seconds-per-pair", "2.5e-5"]) == 0
    out = capsys.readouterr().out
    assert "2.5e-05 s per scored pair (given)" in out
    full_row = next(line for line in out.splitlines() if line.startswith("full ranking"))
    assert "10.0 min" in full_row
    ref = plan(20_000, 1200, "ndcg@10", 0.15, designs=[SamplingDesign(50), SamplingDesign(100, adaptive_max=3200)],
               repeats=2, seconds_per_pair=2.5e-5)
    assert out.strip() == ref.format().strip()
    assert cli.main(PLAN_ARGS) == 0  # without it: no times
    assert "per scored pair" not in capsys.readouterr().out
    assert "--seconds-per-pair" in cli.build_parser()._subparsers._group_actions[0].choices["plan"].format_help()


@pytest.mark.parametrize("bad", ["0", "-1e-5", "nan", "inf"])
def test_cli_bad_seconds_per_pair_is_one_line(bad, capsys):
    assert cli.main(PLAN_ARGS + [f"--seconds-per-pair={bad}"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("reco-sampled: error: seconds_per_pair: expected a finite number")


def test_cli_seconds_per_pair_not_a_number(capsys):
    with pytest.raises(SystemExit) as exc:  # argparse's own error, as for every float option
        cli.main(PLAN_ARGS + ["--seconds-per-pair", "fast"])
    assert exc.value.code == 2
    assert "argument --seconds-per-pair: invalid float value: 'fast'" in capsys.readouterr().err


# ---------------------------------------------------------------------- rank files from an external scorer loop
def _scorer_run(design, seed=12):
    """A scorer run with several positives per row (padding), excluded items and ties: per-positive n varies."""
    g = torch.Generator().manual_seed(seed)
    b, n = 300, 700
    picks = torch.stack([torch.randperm(n, generator=g)[:40] for _ in range(b)])
    pos, exclude = picks[:, :3].clone(), picks[:, 3:].clone()
    pos[::2, 2] = -1
    exclude[::3, 10:] = -1
    # a recommender that puts the positives high: the adaptive stages run
    scores = torch.randn(b, n, generator=g, dtype=torch.float64).round(decimals=1)
    scores.scatter_(1, pos.clamp(min=0), scores.gather(1, pos.clamp(min=0)) + 2.5)
    return sampled_ranks_from_scorer(MatrixScorer(scores), pos, n, design, exclude=exclude, generator=g,
                                     max_pairs=5000)


def _cli_values(out: str) -> dict[tuple[str, str], float]:
    rows = {}
    for line in out.splitlines():
        match = re.match(r"^(\S+@\d+|\S+)\s+(\S+)\s+(-?\d+\.\d{5})\s+\[", line)
        if match:
            rows[(match.group(1), match.group(2))] = float(match.group(3))
    return rows


@pytest.mark.parametrize("design", [SamplingDesign(30), SamplingDesign(30, replacement=False),
                                    SamplingDesign(20, adaptive_max=320)], ids=["m30", "m30-without", "adaptive"])
def test_rank_file_from_scorer_run_estimates_back_through_the_cli(tmp_path, capsys, design):
    sampled = _scorer_run(design)
    path = write_rank_file(tmp_path / "ranks.csv", sampled)
    text = path.read_text()
    comments = [line for line in text.splitlines() if line.startswith("#")]
    flags = re.search(r"^# read back: reco-sampled estimate FILE (.*)$", text, re.M).group(1).split()
    expected_flags = {"m30": ["--n-samples", "30"], "m30-without": ["--n-samples", "30", "--sampling", "hypergeometric"],
                      "adaptive": ["--n-samples", "20", "--adaptive-max", "320"]}
    assert flags in expected_flags.values() and (design.adaptive_max is not None) == ("--adaptive-max" in flags)
    cost = sampled.cost
    assert any(f"{cost.pairs:,} pairs in {cost.calls:,} calls" in c for c in comments)
    # the file: one line per positive, row order, padding dropped, adaptive sizes kept
    data = read_rank_file(path)
    keep = sampled.ranks > 0
    assert np.array_equal(data.ranks, sampled.ranks[keep].numpy())
    assert np.array_equal(data.n_items, sampled.candidates()[keep].numpy())
    m = sampled.n_samples[keep].numpy() if sampled.n_samples is not None else np.full(len(data.ranks), 30)
    assert np.array_equal(data.n_samples, m)
    if design.adaptive_max is not None:
        assert data.n_samples.max() > 20  # the stages ran: the file carries final sizes, not the first m
    methods = ["none", "mes"] + (["bv"] if design.adaptive_max is None else [])
    metrics = ["ndcg@10", "hit@5"]
    argv = ["estimate", str(path), *flags, "--no-progress"]
    for x in metrics:
        argv += ["--metric", x]
    for x in methods:
        argv += ["--method", x]
    assert cli.main(argv) == 0
    printed = _cli_values(capsys.readouterr().out)
    assert len(printed) == len(metrics) * len(methods)
    for metric in metrics:
        for method in methods:
            value = rsp.estimate(metric, sampled, method=method).value
            assert printed[(metric, method)] == pytest.approx(value, abs=5.1e-6), (metric, method)
            # the file read back in Python: the same estimate to rounding
            again = rsp.estimate(metric, rsp.SampledRanks.from_arrays(data.ranks, data.n_items, data.n_samples, design),
                                 method).value
            assert again == pytest.approx(value, rel=1e-9, abs=1e-12)


def test_write_rank_file_refusals(tmp_path):
    sampled = _scorer_run(SamplingDesign(30))
    with pytest.raises(ValueError, match="^sampled: expected the SampledRanks"):
        write_rank_file(tmp_path / "x.csv", sampled.ranks)
    with pytest.raises(ValueError, match="is a directory|cannot be written"):
        write_rank_file(tmp_path, sampled)
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(20, 100, generator=g)
    # popularity draws are written with their statistics (hh_s1, hh_s2: tests/test_popularity_entry_points.py);
    # without replacement they keep none, and are refused
    pop = rsp.sampled_ranks(scores, torch.arange(20), SamplingDesign(10, popularity=torch.rand(100, generator=g),
                                                                     replacement=False), generator=g)
    with pytest.raises(ValueError, match="^sampled: these popularity-sampled ranks carry no per-draw statistics"):
        write_rank_file(tmp_path / "x.csv", pop)
    avg = rsp.sampled_ranks(scores.round(), torch.arange(20), 10, generator=g, ties="average")
    assert not bool((avg.ranks == avg.ranks.floor()).all())  # ties shared: half ranks
    with pytest.raises(ValueError, match="^sampled: the ranks are not whole"):
        write_rank_file(tmp_path / "x.csv", avg)
    empty = rsp.sampled_ranks(scores, torch.full((20, 1), -1), 10, generator=g)
    with pytest.raises(ValueError, match="^sampled: no positive"):
        write_rank_file(tmp_path / "x.csv", empty)
    assert not (tmp_path / "x.csv").exists()



def test_scorer_loop_on_any_device_pilots_the_plan_and_writes_a_rank_file(device, tmp_path):
    """A scorer run on the device (CUDA where there is one) is a pilot and a rank file as on the CPU."""
    g = torch.Generator(device=device).manual_seed(13)
    scores = torch.randn(200, 500, generator=g, device=device)
    positives = torch.randint(0, 500, (200,), generator=g, device=device)
    design = SamplingDesign(20, adaptive_max=320)
    run = sampled_ranks_from_scorer(MatrixScorer(scores), positives, 500, design, generator=g)
    result = plan(500, 200, "hit@10", 0.5, pilot=run, designs=[SamplingDesign(40)], repeats=2)
    assert result.shape_source.startswith("pilot: mes fit on 200 sampled ranks")
    assert result.seconds_per_pair == run.cost.scorer_seconds / run.cost.pairs
    data = read_rank_file(write_rank_file(tmp_path / "r.csv", run))
    assert np.array_equal(data.ranks, run.ranks.cpu().numpy().reshape(-1))
    assert np.array_equal(data.n_samples, run.n_samples.cpu().numpy().reshape(-1))
