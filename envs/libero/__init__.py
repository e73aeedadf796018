"""LIBERO (its suites as one env family). LIBERO pins robosuite 1.4, which our venv cannot hold:
its simulators run in child processes under the family's own environment (``.venv-libero``,
``requirements-libero.txt``; ``embodied_async.isolated``). ``configuration_libero`` and
``libero_env`` run in our venv and never import LIBERO; ``libero_child`` runs in the child."""
