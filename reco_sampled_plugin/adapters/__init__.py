"""Framework adapters, installed as ``reco_sampled_plugin.adapters.<framework>``.

Each module translates one framework's data into ranks and the core's estimates back into that
framework's logging; none holds statistics of its own. Importing this package imports no framework.
"""
