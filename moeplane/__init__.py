"""moeplane: the control plane for Mixture-of-Experts training clusters.

One import package, mapped onto the repository's top-level folders:

- :mod:`moeplane.controlplane` — the service (ingest, store, bus, balancing, memory, controller,
  REST API, CLI);
- :mod:`moeplane.agents` — the node agent, the simulator and the in-process SDK;
- :mod:`moeplane.dashboard` — the Plotly Dash app, served by the control plane;
- :mod:`moeplane.migrations` — the Alembic migrations.

Training code imports only :mod:`moeplane.torch`, the public SDK surface. ``import moeplane``
imports neither torch nor SQLAlchemy.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("moeplane")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.0.0"

__all__ = ["__version__"]
