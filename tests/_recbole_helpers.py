"""Helpers shared by the RecBole test modules (real Trainers, no mocks)."""

from __future__ import annotations


def evaluate_with_struct(trainer, data, reseed: bool = False):
    """``trainer.evaluate(data)`` and the DataStruct RecBole's evaluator saw (captured by wrapping the evaluator's
    ``evaluate`` for this one call). ``reseed``: reset RecBole's seeds first, so its samplers draw the same first
    stage every time (a loader marked by :func:`replay_seeded_draws` then gives the batches it drew after the same
    seed before)."""
    from recbole.utils import init_seed

    seen = {}
    original = trainer.evaluator.evaluate

    def capture(struct):
        seen["struct"] = struct
        return original(struct)

    trainer.evaluator.evaluate = capture
    if reseed:
        init_seed(trainer.config["seed"], True)
        data.__dict__["_seeded_with"] = trainer.config["seed"]
    try:
        result = trainer.evaluate(data, load_best_model=False)
    finally:
        trainer.evaluator.evaluate = original
        data.__dict__.pop("_seeded_with", None)
    return result, seen["struct"]


def replay_seeded_draws(loader):
    """Mark the evaluation loader ``loader``: an evaluation reseeded by ``evaluate_with_struct(..., reseed=True)``
    gets the batches of the first complete evaluation after the same seed (recorded as RecBole drew them) instead
    of drawing the same negatives again (RecBole's samplers draw from the generators ``init_seed`` resets, and
    nothing else draws from them during an evaluation: the same seed, the same batches; RecBole's pop100 sampler
    costs seconds per evaluation). Other iterations of ``loader`` (not reseeded) draw as RecBole does. Only this
    instance changes (its class becomes a subclass that overrides ``__iter__``); returns ``loader``."""
    cls = type(loader)
    if not getattr(cls, "_replays_seeded_draws", False):
        loader.__class__ = type(cls.__name__, (cls,), {"__iter__": _replaying_iter(cls.__iter__),
                                                       "_replays_seeded_draws": True})
    loader.__dict__.setdefault("_seeded_batches", {})
    return loader


def _replaying_iter(original):
    def __iter__(self):
        seed = self.__dict__.get("_seeded_with")
        if seed is None:
            return original(self)
        recorded = self.__dict__["_seeded_batches"]
        if seed in recorded:
            return iter(recorded[seed])
        return _recording(original(self), recorded, seed)

    return __iter__


def _recording(batches, recorded: dict, seed):
    """The batches as drawn, kept for ``seed`` once the iteration is complete (an interrupted one is not)."""
    seen = []
    for batch in batches:
        seen.append(batch)
        yield batch
    recorded[seed] = seen
