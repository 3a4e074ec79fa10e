"""The runner's Hydra launcher plugins. Hydra finds plugins only in the ``hydra_plugins`` namespace: the
Makefile puts ``runner/launch/plugins`` on the environment's path (a ``.pth`` file), so that this package is
that namespace's part of the runner."""
