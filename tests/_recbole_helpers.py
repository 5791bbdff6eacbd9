"""Helpers shared by the RecBole test modules (real Trainers, no mocks)."""

from __future__ import annotations


def evaluate_with_struct(trainer, data, reseed: bool = False):
    """``trainer.evaluate(data)`` and the DataStruct RecBole's evaluator saw (captured by wrapping the evaluator's
    ``evaluate`` for this one call). ``reseed``: reset RecBole's seeds first, so its samplers draw the same first
    stage every time."""
    from recbole.utils import init_seed

    seen = {}
    original = trainer.evaluator.evaluate

    def capture(struct):
        seen["struct"] = struct
        return original(struct)

    trainer.evaluator.evaluate = capture
    if reseed:
        init_seed(trainer.config["seed"], True)
    try:
        result = trainer.evaluate(data, load_best_model=False)
    finally:
        trainer.evaluator.evaluate = original
    return result, seen["struct"]
