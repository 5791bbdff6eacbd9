import os

import pytest
import torch
from hypothesis import settings

# hypothesis profiles: ``fast`` (default: derandomised, so make test is reproducible), ``long`` for a deep fuzzing
# run (``pytest tests/test_fuzz.py --hypothesis-profile long``) and ``quick`` for a developer's loop. Every count in
# the tests is written at the fast profile's scale and scaled to the loaded profile (tests/_profiles.py: examples).
settings.register_profile("fast", max_examples=40, deadline=None, derandomize=True)
settings.register_profile("long", max_examples=2000, deadline=None)
settings.register_profile("quick", max_examples=8, deadline=None, derandomize=True)
settings.load_profile("fast")

# Small inputs stay on the eager counting path; tests that exercise the compiled kernel say so.
os.environ.setdefault("RECO_SAMPLED_BACKEND", "auto")

# `make test` runs the suite on every core with pytest-xdist (the Makefile's -n auto): each worker then takes its
# share of the cores for torch's intra-op pool (and passes it to the subprocesses it starts), so that two workers
# on two cores do not run four spinning threads.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _share = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    os.environ.setdefault("OMP_NUM_THREADS", _share)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(autouse=True)
def _no_leaked_anomaly_mode():
    """Importing RecBole's sequential models (recbole/model/sequential_recommender/sine.py) turns torch's anomaly
    detection on for the whole process: every later backward pass in the worker then checks for NaN and keeps a stack
    trace per node (the same values, a fifth to a third more time in RecBole's training). Switched off after the test
    that imported them, so later tests run as a user's process would."""
    yield
    if torch.is_anomaly_enabled():
        torch.autograd.set_detect_anomaly(False)


@pytest.fixture(autouse=True)
def _fresh_counting_process():
    """Each test counts as a fresh process would: the ``auto`` counting backend compiles its kernel only once a
    process has counted ``counting._COMPILE_AFTER_WORK`` comparisons, and a test worker that ran other tests before
    would otherwise cross it part-way through some later test, whose path (compiled or eager) and cost then
    depended on the tests before it in that worker. Tests of the compiled path ask for it (``set_backend``)."""
    from reco_sampled_plugin import counting

    counting._work_done[0] = 0
    yield


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A working directory of the module's own: RecBole writes log/, log_tensorboard/ and saved/ relative to it."""
    path = tmp_path_factory.mktemp("workdir")
    old = os.getcwd()
    os.chdir(path)
    yield path
    os.chdir(old)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(12345)


# Devices every device-parametrised test runs on: the CPU always, CUDA when this machine has it.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    """Each available device in turn (``cpu``; ``cuda`` too on a GPU machine)."""
    return torch.device(request.param)


@pytest.fixture(params=["eager", "compiled"])
def backend(request):
    """Each counting backend in turn (``reco_sampled_plugin.counting.set_backend``), restored afterwards."""
    from reco_sampled_plugin import counting

    before = counting.get_backend()
    counting.set_backend(request.param)
    yield request.param
    counting.set_backend(before)


# ------------------------------------------------------------------ real data and trained recommenders, shared
# MovieLens 100k (inside the recbole wheel) and ml-latest-small (inside this package) with the paper's four
# recommenders trained once per test process (deterministic: seed 0), and the held-out items' exact ranks.
@pytest.fixture(scope="session")
def ml100k_split():
    """The leave-last-out split of MovieLens 100k (``datasets.load_ml100k()``)."""
    from reco_sampled_plugin import datasets

    return datasets.load_ml100k()


@pytest.fixture(scope="session")
def ml100k_models(ml100k_split):
    """``baselines.train_all(split.train, seed=0)``: iALS, ItemKNN(q=3), ItemKNN(q=1,k'=10), Popularity."""
    from reco_sampled_plugin import baselines

    return baselines.train_all(ml100k_split.train, seed=0)


@pytest.fixture(scope="session")
def ml100k_held_out(ml100k_split, ml100k_models):
    """``baselines.held_out_ranks(models, split)``: ({name: exact ranks of the held-out item}, n per user)."""
    from reco_sampled_plugin import baselines

    return baselines.held_out_ranks(ml100k_models, ml100k_split)


def _knn_pop_held_out(split):
    """ItemKNN(q=3) and Popularity fitted on ``split.train`` as ``baselines.train_all`` fits them (deterministic),
    and their held-out items' exact ranks: ({name: exact ranks}, n per user)."""
    from reco_sampled_plugin import baselines

    models = {"ItemKNN(q=3)": baselines.ItemKNN(q=3).fit(split.train), "Popularity": baselines.Popularity().fit(split.train)}
    return baselines.held_out_ranks(models, split)


@pytest.fixture(scope="session")
def ml100k_knn_pop_held_out(ml100k_split):
    """ItemKNN(q=3) and Popularity alone on MovieLens 100k's split: the very arrays ``ml100k_held_out`` gives for
    them, without training iALS and ItemKNN(q=1,k'=10) (2 s of CPU) in a worker whose tests read only these two
    (the planner's checks against simulation)."""
    return _knn_pop_held_out(ml100k_split)


@pytest.fixture(scope="session")
def ml_latest_small_held_out():
    """ItemKNN(q=3) and Popularity on ml-latest-small's leave-last-out split: ({name: exact ranks}, n per user)."""
    from reco_sampled_plugin import datasets

    return _knn_pop_held_out(datasets.load_ml_latest_small())
