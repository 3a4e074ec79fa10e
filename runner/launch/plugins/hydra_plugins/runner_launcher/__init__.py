"""The runner's Hydra launcher and sweepers. Hydra finds plugins only in the ``hydra_plugins`` namespace:
importing :mod:`runner` puts ``runner/launch/plugins`` on the import path (``runner.PLUGINS``), so that this
package is that namespace's part of the runner."""
