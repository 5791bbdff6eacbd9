"""Sampling designs: how the irrelevant items of a sampled evaluation are drawn, as one validated object.

A :class:`SamplingDesign` is data, like a correction table: every entry point that samples or estimates takes
one (or an int m, which means uniform with replacement) and none re-validates its parts. A draw returns
:class:`~reco_sampled_plugin.ranking.SampledRanks` that carry their design, so ``estimate(metric, sampled)``
needs nothing else and an estimator cannot be applied to a design it does not support (the estimator registry,
``registry.py``, says which designs each estimator takes).

==================================  ========================================================================
design                              law of the sampled rank r~ given the exact rank r (docs/estimators.md)
==================================  ========================================================================
``SamplingDesign(m)``               r~ - 1 ~ Binomial(m, (r - 1)/(n - 1))           (``law == "binomial"``)
``SamplingDesign(m,                 r~ - 1 ~ Hypergeometric(n - 1, r - 1, m)    (``law == "hypergeometric"``)
replacement=False)``
``SamplingDesign(m,                 stages M_s = m 2^s <= adaptive_max; a positive still first draws M_s more
adaptive_max=cap)``                 (Li et al., AAAI 2023; ``adaptive.py``): Binomial at the final M, times a
                                    factor free of r
``SamplingDesign(m,                 as above, but a positive draws more while its sampled rank is at most t
adaptive_max=cap,                   (not only while first): the same Binomial at the final M times a factor
adaptive_top=t)``                   free of r (``adaptive.py``)
``SamplingDesign(m,                 as above; positives still within the top (r~ <= t) at the cap are then
adaptive_max=cap,                   ranked exactly among their whole candidate list (``SampledRanks.exact_ranks``):
exact_at_cap=True)``                the likelihood of such a positive is the point mass at its exact rank R
``SamplingDesign(m,                 r~ - 1 ~ Binomial(m, q(A)), q the popularity law renormalised over the
popularity=w)``                     row's irrelevant items, A the items above the positive (``law ==
                                    "popularity"``; ``hh`` corrects AUC and mean rank: docs/popularity.md)
``SamplingDesign(m,                 any design above, and besides each positive's sampled rank a keyed random
exact_share=ExactShare(...))``      share of the positives ranked exactly (Poisson sampling with known
                                    inclusion probabilities, ``SampledRanks.share_ranks`` / ``inclusion``): the
                                    difference estimator ``diff`` (``_design_based.py``) holds by design
==================================  ========================================================================

A design without popularity weights has a one-line spec (:func:`design_spec`, read back by :func:`parse_design`):
the planner prints it, ``reco-sampled plan --design`` and RecBole's ``rsp_design`` key take it (:data:`SPEC_SYNTAX`).

Adding a design (docs/architecture.md): a keyword here, validated in ``__post_init__``, a ``law`` name, the draw
in ``ranking.py`` (or ``adaptive.py``), and the ``supports_*`` flag the registry's entries declare.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, overload, runtime_checkable

import numpy as np

from ._checks import MAX_SAMPLES, MIN_INCLUSION, ArgumentTypeError, check_required, check_size, renamed
from ._options import check_bool

if TYPE_CHECKING:  # torch is imported where weights are checked, not with this module
    import torch

    from ._types import TensorLike

__all__ = ["SamplingDesign", "AdaptiveDesign", "ExactShare", "as_design", "planned_design", "PlannedDesign",
           "adaptive_design", "coerce_adaptive", "popularity_weights", "parse_design", "design_spec", "SPEC_SYNTAX"]


@dataclass(frozen=True)
class AdaptiveDesign:
    """Start m, cap and continuation rule of adaptive sampling (the cap is rounded down to m 2^s: :attr:`cap`):
    a positive draws more while its sampled rank is at most ``top`` (1: while first, Li et al.)."""

    n_samples: int
    adaptive_max: int
    top: int = 1

    def __post_init__(self) -> None:
        m = check_size(self.n_samples, "n_samples", 1, MAX_SAMPLES)
        cap = check_size(self.adaptive_max, "adaptive_max", 1, MAX_SAMPLES)
        if cap < m:
            raise ValueError(f"adaptive_max: must be at least n_samples (m = {m}), got {cap}")
        object.__setattr__(self, "n_samples", m)
        object.__setattr__(self, "adaptive_max", cap)
        object.__setattr__(self, "top", check_size(self.top, "adaptive_top", 1, m))

    @property
    def stages(self) -> np.ndarray:
        """Sample sizes M_s = m 2^s <= adaptive_max (int64, ascending)."""
        s = int(math.floor(math.log2(self.adaptive_max / self.n_samples) + 1e-12))
        return self.n_samples * (2 ** np.arange(s + 1, dtype=np.int64))

    @property
    def cap(self) -> int:
        """The largest stage size (m 2^S <= adaptive_max)."""
        return int(self.stages[-1])


#: How :class:`ExactShare` chooses its positives: the same probability for each, or one following the model's spread
SHARE_CHOICES = ("uniform", "active")


@dataclass(frozen=True)
class ExactShare:
    """A keyed random share of the positives ranked exactly besides their sampled ranks (``_design_based.py``).

    Each positive i is chosen independently (Poisson sampling) with inclusion probability pi_i, by a keyed uniform
    u_i of (``seed``, row id, positive item): chosen iff u_i < pi_i, so the same positive of the same user is chosen
    whichever batch, process or recommender draws it (paired differences share the exact positives).

    Args:
        share: the mean inclusion probability, in [1e-9, 1] (1: every positive ranked exactly; ``MIN_INCLUSION``).
        choice: ``"uniform"`` (pi_i = share) or ``"active"``: pi_i = min(1, max(floor, c s_i)), s_i the model's
            spread of M(R) given the positive's sampled data (``_design_based.inclusion_probabilities``), c such that
            the mean is ``share`` (Zrnic & Candes, ICML 2024: labels where the model is least sure).
        metric: ``"active"``: the metric whose spread sets pi (a metric name, default ``"ndcg@10"``).
        floor: ``"active"``: the least pi_i, in [1e-9, share] (default share / 5, at least 1e-9): no positive has
            probability 0, so the Horvitz-Thompson mean stays unbiased whatever the model.
        seed: the key of the choice (an integer in 0..2**63 - 1).
    """

    share: float
    choice: str = "uniform"
    metric: str = "ndcg@10"
    floor: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        from ._options import check_choice, check_seed

        try:
            share = float(self.share)
        except (TypeError, ValueError):
            raise ValueError(f"share: expected a number in (0, 1], got {self.share!r}") from None
        # the bound in the value's own precision (numpy's float32 1e-9 is 9.99999972e-10 as a Python float)
        floor = float(np.asarray(MIN_INCLUSION, dtype=self.share.dtype)) if isinstance(self.share, np.floating) \
            else MIN_INCLUSION
        if isinstance(self.share, bool) or not floor <= share <= 1.0:
            raise ValueError(f"share: expected a number in (0, 1], at least {MIN_INCLUSION:g} (MIN_INCLUSION), got "
                             f"{self.share!r}")
        share = max(share, MIN_INCLUSION)
        object.__setattr__(self, "share", share)
        object.__setattr__(self, "choice", check_choice(self.choice, SHARE_CHOICES, "choice"))
        if not isinstance(self.metric, str):
            raise ValueError(f"metric: expected a metric name such as 'ndcg@10', got {self.metric!r}")
        floor = max(share / 5.0, MIN_INCLUSION) if self.floor is None else self.floor
        if (isinstance(floor, bool) or not isinstance(floor, (int, float, np.floating))
                or not MIN_INCLUSION <= float(floor) <= share):
            raise ValueError(f"floor: expected a number in [{MIN_INCLUSION:g}, share = {share:g}], got {self.floor!r}")
        object.__setattr__(self, "floor", float(floor))
        object.__setattr__(self, "seed", check_seed(self.seed, "seed"))

    def describe(self) -> str:
        return f"exact share {self.share:g} ({self.choice})"


def _check_popularity(w: Any) -> torch.Tensor:
    """Popularity weights as a 1-D float64 tensor (kept on its device): finite, >= 0, a positive finite total."""
    import torch

    from ._checks import check_weights

    t = check_weights(w, "popularity")
    if t.dim() != 1 or t.numel() == 0:
        raise ValueError(f"popularity: expected one weight per item (a 1-D array), got shape {tuple(t.shape)}")
    if not float(t.sum()) > 0:
        raise ValueError("popularity: the weights sum to 0; at least one item must be drawable")
    return t.detach().to(torch.float64)


def popularity_weights(counts: TensorLike, alpha: float = 1.0) -> torch.Tensor:
    """Popularity weights w_j = c_j^alpha of interaction counts c_j, as RecBole's ``popN`` draws (``Sampler``'s alias
    table: q_j proportional to (c_j / total)^alpha over the items that occur; an item with no interaction is never
    drawn, so its weight is 0 whatever alpha, negative alpha included).

    Args:
        counts: (n_items,) interaction counts per item (RecBole: over all phases), finite, >= 0.
        alpha: the exponent (RecBole's ``train_neg_sample_args.alpha``, 1 by default), a finite number.

    Returns:
        float64 tensor of the weights (on the counts' device), for ``SamplingDesign(m, popularity=...)``.

    Raises:
        ValueError: naming ``alpha`` (NaN, inf, not a number) or ``counts``.
    """
    import torch

    from ._checks import check_weights
    from ._options import check_float

    a = check_float(alpha, "alpha")
    c = check_weights(counts, "counts")
    if c.dim() != 1:
        raise ValueError(f"counts: expected one count per item (a 1-D array), got shape {tuple(c.shape)}")
    w = torch.where(c > 0, c.clamp(min=1e-300) ** a, torch.zeros_like(c))
    if not bool(torch.isfinite(w).all()):
        raise ValueError(f"alpha: {a:g} overflows the weights count^alpha in float64; use a smaller |alpha|")
    return w


@dataclass(frozen=True, eq=False)
class SamplingDesign:
    """How each relevant item's m irrelevant items are drawn (module docstring), validated once.

    Args:
        n_samples: m, sampled irrelevant items per relevant item (the first stage's m for adaptive designs),
            1..2^24.
        replacement: draw with replacement (default; the binomial law) or without (hypergeometric).
        popularity: optional (n_items,) non-negative weights: items drawn with probability proportional to
            them (renormalised over each row's irrelevant items); a tensor stays on its device.
        adaptive_max: the cap of adaptive sampling (positives still ranked first draw as many again, m doubling,
            up to the largest m 2^s <= adaptive_max); needs ``replacement=True`` and uniform draws.
        adaptive_top: adaptive designs only: a positive draws more while its sampled rank is at most this t, in
            1..m (default 1: while first, Li et al.'s rule). A larger t follows every positive that may be in the
            top K further (t = 3 with ``exact_at_cap`` ranks nearly every top-10 positive exactly at a low cap:
            docs/research-notes.md, "The threshold rule"); stages then draw for more positives.
        exact_at_cap: adaptive designs only: rank the positives still within the top (r~ <= ``adaptive_top``) at
            the cap exactly among their whole candidate list (n - 1 irrelevant items: catalogue minus the row's
            positives minus its exclusions), so the top is resolved (no ``cap_reached``). Costs n - 1 scored pairs
            per row with such a positive in the scorer loop; draws nothing (the draws equal those without it).
            Default False.
        exact_share: an :class:`ExactShare` (a number s means ``ExactShare(s)``, a uniform share): a keyed random
            share of the positives is also ranked exactly among its whole candidate list (``SampledRanks.share_ranks``,
            ``inclusion``), which the difference estimator ``diff`` (``auto``'s choice then) reads. The draws equal
            those without it. Not with ``exact_at_cap``. Default None.

    An ``int`` m where a design is expected means ``SamplingDesign(m)`` (:func:`as_design`); nothing else stands for
    a design.
    """

    n_samples: int
    replacement: bool = field(default=True, kw_only=True)
    popularity: Any = field(default=None, kw_only=True)
    adaptive_max: int | None = field(default=None, kw_only=True)
    adaptive_top: int = field(default=1, kw_only=True)
    exact_at_cap: bool = field(default=False, kw_only=True)
    exact_share: ExactShare | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        m = check_size(self.n_samples, "n_samples", 1, MAX_SAMPLES)
        object.__setattr__(self, "n_samples", m)
        object.__setattr__(self, "replacement", check_bool(self.replacement, "replacement"))
        object.__setattr__(self, "exact_at_cap", check_bool(self.exact_at_cap, "exact_at_cap"))
        if self.exact_at_cap and self.adaptive_max is None:
            raise ValueError("exact_at_cap: completes the positives still first at the cap of adaptive sampling; "
                             "give adaptive_max too (a fixed m has no cap)")
        if self.popularity is not None:
            object.__setattr__(self, "popularity", _check_popularity(self.popularity))
        if self.exact_share is not None:
            try:  # a number s is ExactShare(s): its refusal names the argument given here
                share = self.exact_share if isinstance(self.exact_share, ExactShare) else ExactShare(self.exact_share)
            except ValueError as exc:
                raise type(exc)(renamed(str(exc), {"share": "exact_share"})) from None
            object.__setattr__(self, "exact_share", share)
            if self.exact_at_cap:
                raise ValueError("exact_share: not with exact_at_cap (the completed positives would be exact "
                                 "outside the share's design); drop one of them")
            if self.popularity is not None and not self.replacement:
                raise ValueError("exact_share: not with popularity draws without replacement (they keep no per-draw "
                                 "statistics, so only 'none' estimates them, and it reads no share); draw with "
                                 "replacement (SamplingDesign(m, popularity=w, exact_share=...)) for the "
                                 "design-based estimate")
        top = check_size(self.adaptive_top, "adaptive_top", 1, MAX_SAMPLES)
        object.__setattr__(self, "adaptive_top", top)
        if self.adaptive_max is None and top != 1:
            raise ValueError(f"adaptive_top: the continuation rule of adaptive sampling; give adaptive_max too (a "
                             f"fixed m draws once), got adaptive_top={top}")
        if self.adaptive_max is not None:
            cap = AdaptiveDesign(m, self.adaptive_max, self.adaptive_top)  # validates adaptive_max >= m, 1 <= t <= m
            object.__setattr__(self, "adaptive_max", cap.adaptive_max)
            object.__setattr__(self, "adaptive_top", cap.top)
            if not self.replacement:
                raise ValueError("replacement: adaptive sampling draws with replacement (binomial law); "
                                 "drop replacement=False or adaptive_max")
            if self.popularity is not None:
                raise ValueError("popularity: adaptive sampling draws uniformly; drop popularity or adaptive_max")

    @classmethod
    def trusted(cls, n_samples: int, *, replacement: bool = True, popularity: torch.Tensor | None = None,
                adaptive_max: int | None = None, adaptive_top: int = 1, exact_at_cap: bool = False,
                exact_share: ExactShare | None = None) -> "SamplingDesign":
        """A design from parts a draw has validated already (no second validation, no host synchronisation):
        for the package's draws, which record the design they drew under."""
        self = object.__new__(cls)
        for k, v in (("n_samples", int(n_samples)), ("replacement", bool(replacement)), ("popularity", popularity),
                     ("adaptive_max", None if adaptive_max is None else int(adaptive_max)),
                     ("adaptive_top", int(adaptive_top)),
                     ("exact_at_cap", bool(exact_at_cap)), ("exact_share", exact_share)):
            object.__setattr__(self, k, v)
        return self

    # --------------------------------------------------------------------------------------------- views
    @property
    def law(self) -> str:
        """The sampling law's name: ``"binomial"``, ``"hypergeometric"`` or ``"popularity"``."""
        if self.popularity is not None:
            return "popularity"
        return "binomial" if self.replacement else "hypergeometric"

    @property
    def is_adaptive(self) -> bool:
        return self.adaptive_max is not None

    @property
    def adaptive(self) -> AdaptiveDesign | None:
        """The stages of an adaptive design (:class:`AdaptiveDesign`), None for a fixed m."""
        return None if self.adaptive_max is None else AdaptiveDesign(self.n_samples, self.adaptive_max,
                                                                     self.adaptive_top)

    @property
    def cap(self) -> int:
        """The largest m any positive can reach (the cap of an adaptive design, else m)."""
        adaptive = self.adaptive
        return self.n_samples if adaptive is None else adaptive.cap

    def describe(self) -> str:
        """A short human-readable name: ``uniform m=100``, ``adaptive 100->3200``, ``popularity m=100``..."""
        share = "" if self.exact_share is None else ", " + self.exact_share.describe()
        if self.adaptive_max is not None:
            top = "" if self.adaptive_top == 1 else f" while r~ <= {self.adaptive_top}"
            return (f"adaptive {self.n_samples}->{self.cap}{top}" + (", exact at cap" if self.exact_at_cap else "")
                    + share)
        kind = "popularity" if self.popularity is not None else "uniform"
        extra = "" if self.replacement else ", without replacement"
        return f"{kind} m={self.n_samples}{extra}{share}"

    # ------------------------------------------------------------------------------- equality and hashing
    def _key(self) -> tuple:
        return (self.n_samples, self.replacement, self.adaptive_max, self.adaptive_top, self.exact_at_cap,
                self.popularity is not None, self.exact_share)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SamplingDesign):
            return NotImplemented
        if self._key() != other._key():
            return False
        if self.popularity is None:
            return True
        a, b = self.popularity, other.popularity
        return a.shape == b.shape and bool((a.cpu() == b.cpu()).all())

    def __hash__(self) -> int:
        return hash(self._key() + ((0 if self.popularity is None else self.popularity.numel()),))

    def __repr__(self) -> str:
        parts = [str(self.n_samples)]
        if not self.replacement:
            parts.append("replacement=False")
        if self.popularity is not None:
            parts.append(f"popularity=<{self.popularity.numel()} weights>")
        if self.adaptive_max is not None:
            parts.append(f"adaptive_max={self.adaptive_max}")
        if self.adaptive_top != 1:
            parts.append(f"adaptive_top={self.adaptive_top}")
        if self.exact_at_cap:
            parts.append("exact_at_cap=True")
        if self.exact_share is not None:
            parts.append(f"exact_share={self.exact_share!r}")
        return f"SamplingDesign({', '.join(parts)})"


@runtime_checkable
class PlannedDesign(Protocol):
    """What stands for a design it carries: the planner's results (:class:`~reco_sampled_plugin.planner.Plan`, its
    recommended design; :class:`~reco_sampled_plugin.planner.DesignForecast`, its design). A protocol, so that this
    module imports no planner (the planner builds on it)."""

    def sampling_design(self, name: str) -> SamplingDesign:
        """The design, or a ValueError naming ``name`` where there is none (a plan recommending full ranking)."""
        ...


def planned_design(design: Any, name: str = "n_samples") -> Any:
    """The design a planner result stands for (:class:`PlannedDesign`: ``plan(...)``, its ``recommended``, any of
    its ``forecasts``); anything else as is. A plan that recommends full ranking is a ValueError naming ``name``."""
    if design is None or isinstance(design, (SamplingDesign, int, np.integer)):
        return design
    return design.sampling_design(name) if isinstance(design, PlannedDesign) else design


@overload
def as_design(design: None, *, name: str = "n_samples") -> None: ...
@overload
def as_design(design: SamplingDesign | int | PlannedDesign, *, name: str = "n_samples") -> SamplingDesign: ...
def as_design(design: SamplingDesign | int | PlannedDesign | None, *,
              name: str = "n_samples") -> SamplingDesign | None:
    """The one coercion of the package: a :class:`SamplingDesign` returned as is, an int m as ``SamplingDesign(m)``
    (uniform with replacement), a planner result as its design (:func:`planned_design`: a ``Plan``'s recommended
    one, a ``DesignForecast``'s), None as None; anything else is a ValueError naming ``name``."""
    given: Any = planned_design(design, name)  # a planner result as its SamplingDesign, anything else as is
    if given is None or isinstance(given, SamplingDesign):
        return given
    if isinstance(given, (AdaptiveDesign, tuple, list)):
        raise ValueError(f"{name}: expected a SamplingDesign or an int m, got {given!r}; an adaptive design is "
                         "SamplingDesign(m, adaptive_max=cap)")
    try:
        return SamplingDesign(given)
    except ValueError as exc:
        raise ValueError(f"{name}: {str(exc).partition(': ')[2]}") from None


def coerce_adaptive(adaptive: SamplingDesign | AdaptiveDesign | tuple[int, int | None] | None) -> AdaptiveDesign | None:
    """An :class:`AdaptiveDesign` from an ``adaptive=`` argument: a design (adaptive or not), an
    AdaptiveDesign, an ``(m, adaptive_max)`` pair, or None (a fixed-m SamplingDesign gives None)."""
    if adaptive is None or isinstance(adaptive, AdaptiveDesign):
        return adaptive
    if isinstance(adaptive, SamplingDesign):
        return adaptive.adaptive
    try:
        if isinstance(adaptive, (str, bytes)):  # '10' would unpack into the pair ('1', '0')
            raise TypeError
        m, cap = adaptive
    except (TypeError, ValueError):
        raise ValueError(f"adaptive: expected an AdaptiveDesign or (n_samples, adaptive_max), got {adaptive!r}") from None
    return adaptive_design(m, cap)


def adaptive_design(n_samples: int | None, adaptive_max: int | None) -> AdaptiveDesign | None:
    """The design of the entry points' ``n_samples`` / ``adaptive_max`` pair (None without a cap)."""
    if adaptive_max is None:
        return None
    if isinstance(adaptive_max, AdaptiveDesign):
        return adaptive_max
    if n_samples is None:
        raise ValueError("adaptive_max: needs n_samples (the first stage's sample size m)")
    return AdaptiveDesign(n_samples, adaptive_max)


# ---------------------------------------------------------------------------------------------------- specs
#: The spec syntax of a design (``reco-sampled plan --design``, RecBole's ``rsp_design``): ``M`` a fixed m (with
#: replacement), ``M:norepl`` without, ``M:CAP`` adaptive from m up to the cap, ``M:CAP:topT`` drawing more while
#: r~ <= T (``adaptive_top``), ``M:CAP:exact`` with ``exact_at_cap``;
#: ``+SHARE:CHOICE[:METRIC]`` an exact share (choice ``uniform`` or ``active``, the active share's metric when not
#: ndcg@10; ``+SHARE`` alone is uniform). Examples: ``100``, ``100:3200``, ``100:3200:top3:exact``,
#: ``100:12800+0.03:active``.
SPEC_SYNTAX = "M[:CAP[:topT][:exact]|:norepl][+SHARE[:uniform|:active[:METRIC]]]"
_SPEC_FLAGS = {"exact": "exact_at_cap", "norepl": "replacement"}


def parse_design(spec: str, *, name: str = "spec") -> SamplingDesign:
    """The :class:`SamplingDesign` of a spec (:data:`SPEC_SYNTAX`): ``parse_design(design_spec(d)) == d``.

    Args:
        spec: the spec string. name: the argument the caller's user typed (``rsp_design``...), which a malformed
            spec's message starts with.

    Raises:
        ValueError: a malformed spec (naming ``name`` and the syntax; an ArgumentTypeError for a spec that is not a
            string) or a design its parts cannot make (SamplingDesign's and ExactShare's own messages: ``share:
            expected a number in (0, 1], ...``).
    """
    bad = (f"{name}: expected a design spec {SPEC_SYNTAX} (e.g. '100', '100:3200', '100:3200:top3:exact', "
           f"'100:norepl', '100:12800+0.03:active'), got {spec!r}")
    if not isinstance(spec, str):
        raise ArgumentTypeError(bad)
    sampled, plus, share_text = spec.strip().partition("+")
    m_text, *rest = (t.strip() for t in sampled.split(":"))
    cap = rest.pop(0) if rest and _digits(rest[0]) else None
    top = rest.pop(0)[3:] if cap is not None and rest and rest[0].startswith("top") and _digits(rest[0][3:]) else None
    share, _, tail = (t.strip() for t in share_text.partition(":"))
    choice, _, metric = (t.strip() for t in tail.partition(":"))
    if (not _digits(m_text) or len(set(rest)) < len(rest) or not set(rest) <= set(_SPEC_FLAGS)
            or (plus and not _is_number(share))):
        raise ValueError(bad)
    parts: dict[str, Any] = {_SPEC_FLAGS[flag]: flag == "exact" for flag in rest}  # exact: True; norepl: False
    if cap is not None:
        parts["adaptive_max"] = int(cap)
    if top is not None:
        parts["adaptive_top"] = int(top)
    if plus:
        parts["exact_share"] = ExactShare(float(share), choice=choice or "uniform", metric=metric or ExactShare.metric)
    return SamplingDesign(int(m_text), **parts)


def _digits(text: str) -> bool:
    """ASCII digits only (``str.isdigit`` also takes '²' and other digits that ``int`` cannot read)."""
    return text.isascii() and text.isdigit()


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def design_spec(design: SamplingDesign | int | PlannedDesign) -> str:
    """The spec of a design (:data:`SPEC_SYNTAX`; a planner result's design, an int m), which :func:`parse_design`
    reads back equal. A share is written with its choice (``+0.05:uniform``: RecBole evaluates an unquoted
    ``100+0.05`` as a sum).

    Raises:
        ValueError: naming ``design`` where no spec holds it: popularity weights (give the design itself), an exact
            share with its own ``floor`` or ``seed`` (the spec keeps the defaults: floor share / 5, seed 0).
    """
    d = as_design(check_required(design, "design", "a SamplingDesign, an int m or a planner result"), name="design")
    if d.popularity is not None:
        raise ValueError(f"design: {d.describe()} draws by popularity weights, which a spec cannot hold; pass the "
                         "SamplingDesign (or the planner's result) itself")
    text = str(d.n_samples)
    if d.adaptive_max is not None:
        text += (f":{d.adaptive_max}" + ("" if d.adaptive_top == 1 else f":top{d.adaptive_top}")
                 + (":exact" if d.exact_at_cap else ""))
    elif not d.replacement:
        text += ":norepl"
    share = d.exact_share
    if share is None:
        return text
    if share.floor != max(share.share / 5.0, MIN_INCLUSION) or share.seed != 0:
        raise ValueError(f"design: its exact share sets floor = {share.floor:g} / seed = {share.seed}, which a spec "
                         "cannot hold (it keeps floor share / 5 and seed 0); pass the SamplingDesign itself")
    metric = "" if share.metric == ExactShare.metric else f":{share.metric}"
    return f"{text}+{share.share!r}:{share.choice}{metric}"
