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
    fresh read give the same splits, loaders and batches (checked: see ``prepare_data``)."""
    import copy

    from recbole.data import create_dataset

    key = _read_key(config)
    if key not in _DATASETS:
        _DATASETS[key] = create_dataset(config)
    dataset = copy.deepcopy(_DATASETS[key])
    dataset.config = config
    return dataset


def _read_key(config):
    """What ``create_dataset`` reads: its choice of class (the model's own dataset class, else one per model type)
    and the dataset arguments (those RecBole compares before reusing a saved dataset, and the other keys its reading
    looks at)."""
    import importlib

    from recbole.utils.argument_list import dataset_arguments

    own = hasattr(importlib.import_module("recbole.data.dataset"), config["model"] + "Dataset")
    kind = config["model"] if own else str(config["MODEL_TYPE"])
    read_with = dataset_arguments + ["seed", "repeatable", "data_path", "encoding", "discretization", "numerical_features"]
    return (kind, config["dataset"], *(repr(config[arg]) for arg in read_with))


_SPLITS: dict = {}


def prepare_data(config):
    """``init_seed(config)`` and RecBole's ``data_preparation(config, read_dataset(config))``, the split built once per
    test process for each dataset read and split (``eval_args``' split, order and grouping, the seed): configs that
    differ in what building the split does not read (the evaluation mode, metrics, batch sizes, samplers, training
    settings, the plugin's keys) share it. The first preparation of a split runs as RecBole's and keeps a copy of the
    split as built (``dataset.build()``: the ordering, the split, a sequential dataset's data augmentation, seconds
    for SASRec); a later one runs RecBole's own ``data_preparation`` with its config (its samplers and loaders) on a
    copy of that (the datasets given its config, as a fresh read with it gives: the loaders sort datasets in place,
    and a popularity sampler's alias table follows the order in which it finds the items), and leaves RecBole's
    generators as the first preparation left them: as ``init_seed`` and a fresh preparation would (building draws
    the same for the same split and seed; samplers and loaders draw nothing when made). Checked: the popN runs of
    test_popularity_entry_points.py and every evaluation of test_recbole_adapter.py and test_recbole_scorer.py (the
    three modules in one process too) give the same results, bit for bit, as fresh preparations; the popN sampler's
    alias table and draws are the same as a fresh preparation's."""
    import copy

    from recbole.data import data_preparation
    from recbole.utils import init_seed

    init_seed(config["seed"], config["reproducibility"])
    args = config["eval_args"]
    key = (_read_key(config), repr(args["split"]), repr(args["order"]), repr(args["group_by"]),
           repr(config["reproducibility"]))
    if key not in _SPLITS:
        dataset = read_dataset(config)
        build = dataset.build
        kept = {}

        def build_and_keep():
            built = build()
            kept["split"] = copy.deepcopy((dataset, built))
            return built

        dataset.build = build_and_keep
        try:
            loaders = data_preparation(config, dataset)
        finally:
            del dataset.build
        if "split" not in kept:  # RecBole loaded saved dataloaders (save_dataloaders): nothing built to keep
            return loaders
        whole, built = kept["split"]
        del whole.build  # the copy's own: the class's build
        _SPLITS[key] = (whole, built, _generator_states())
        return loaders
    whole, built, states = copy.deepcopy(_SPLITS[key])
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
