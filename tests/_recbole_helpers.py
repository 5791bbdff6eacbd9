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


_DATASETS: dict = {}


def read_dataset(config):
    """``create_dataset(config)``, read once per test process for each dataset class (RecBole's choice for the
    model: BPR and LightGCN read the same ``Dataset``) and set of dataset arguments (those RecBole compares before
    reusing a saved dataset, and the other keys its reading looks at), deep-copied for every caller with the
    caller's ``config``: ``data_preparation`` reads its split settings from the dataset's config and shuffles the
    dataset in place. Reading ml-100k's files draws nothing from the generators ``init_seed`` reset: the copy and a
    fresh read give the same splits, loaders and batches (checked for every loader of test_recbole_adapter.py and
    for the popN runs of test_popularity_entry_points.py)."""
    import copy
    import importlib

    from recbole.data import create_dataset
    from recbole.utils.argument_list import dataset_arguments

    # create_dataset's choice of class: the model's own dataset class, else one per model type
    own = hasattr(importlib.import_module("recbole.data.dataset"), config["model"] + "Dataset")
    kind = config["model"] if own else str(config["MODEL_TYPE"])
    read_with = dataset_arguments + ["seed", "repeatable", "data_path", "encoding", "discretization", "numerical_features"]
    key = (kind, config["dataset"], *(repr(config[arg]) for arg in read_with))
    if key not in _DATASETS:
        _DATASETS[key] = create_dataset(config)
    dataset = copy.deepcopy(_DATASETS[key])
    dataset.config = config
    return dataset


class SplitOnce:
    """``init_seed`` then RecBole's ``data_preparation(config, read_dataset(config))`` for configs that differ only
    in what the split does not read (the evaluation mode, metrics, the plugin's keys, training settings), the split
    built once. The first call prepares as RecBole does and keeps the built split (``dataset.build()``: the ordering,
    the split, a sequential dataset's data augmentation, seconds for SASRec); a later call runs RecBole's own
    ``data_preparation`` with its config (its samplers and loaders) on a copy of the split as built, the datasets
    given that config (as a fresh read with it gives), and leaves RecBole's generators as the first preparation left
    them: where ``init_seed`` and a fresh preparation would have left them (building draws the same whatever the
    mode; samplers and loaders draw nothing when made). A later config that would split differently is refused."""

    _SPLIT_KEYS = ("seed", "reproducibility", "MODEL_TYPE", "repeatable")

    def __init__(self) -> None:
        self._first = None

    def _split_of(self, config):
        from recbole.utils.argument_list import dataset_arguments

        args = config["eval_args"]
        return (config["model"], config["dataset"], repr(args["split"]), repr(args["order"]), repr(args["group_by"]),
                *(repr(config[k]) for k in (*self._SPLIT_KEYS, *dataset_arguments)))

    def __call__(self, config):
        import copy

        from recbole.data import data_preparation
        from recbole.utils import init_seed

        if self._first is None:
            init_seed(config["seed"], config["reproducibility"])
            dataset = read_dataset(config)
            build = dataset.build
            kept = {}

            def build_and_keep():
                built = build()
                # as built: the loaders then sort datasets in place, and a popularity sampler's alias table
                # follows the order of the items as it finds them
                kept["split"] = copy.deepcopy((dataset, built))
                return built

            dataset.build = build_and_keep
            loaders = data_preparation(config, dataset)
            del dataset.build
            self._first = (self._split_of(config), kept["split"], _generator_states())
            return loaders
        split, kept, states = self._first
        if self._split_of(config) != split:
            raise ValueError("SplitOnce: this config splits the data differently from the first one")
        whole, built = copy.deepcopy(kept)
        for d in (whole, *built):
            d.config = config
        whole.build = lambda: built
        loaders = data_preparation(config, whole)
        _set_generator_states(states)
        return loaders


def _generator_states():
    import random

    import numpy as np
    import torch

    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def _set_generator_states(states) -> None:
    import random

    import numpy as np
    import torch

    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])
