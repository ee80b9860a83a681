"""Serve the plotly.js "cartesian" partial bundle in place of Dash's full plotly.js.

With ``serve_locally`` the Dash renderer loads plotly.js from ``PLOTLY_JS`` (under the
requests prefix) when the first graph mounts; compiling the full 4.8 MB bundle would be most of
the first view. Every figure of the dashboard uses only ``TRACE_TYPES``, all in the 1.4 MB
cartesian bundle (``dashboard/vendor``). It is served only when its version is the one
plotly.py bundles, so the JS matches what dcc.Graph was built against.
"""

from __future__ import annotations

import re
from pathlib import Path

BUNDLE = Path(__file__).parent / "vendor" / "plotly-cartesian.min.js"
PLOTLY_JS = "_dash-component-suites/plotly/package_data/plotly.min.js"  # Dash's URL, served locally
TRACE_TYPES = frozenset({"heatmap", "scatter", "bar", "box"})  # what the dashboard's figures use


def bundle_version(path: Path = BUNDLE) -> str | None:
    """The plotly.js version in the bundle's header comment, None when absent or unreadable."""
    try:
        with path.open("r", encoding="utf-8") as fh:
            head = fh.read(300)
    except OSError:
        return None
    m = re.search(r"plotly\.js \(cartesian - minified\) v(\d+\.\d+\.\d+)", head)
    return m.group(1) if m else None


def serve_partial_plotly(server) -> bool:
    """Route ``/`` + ``PLOTLY_JS`` of the Flask ``server`` to the cartesian bundle (a static
    rule, so it wins over Dash's component-suites rule). Returns whether it is served."""
    import flask
    from plotly.offline import get_plotlyjs_version

    if bundle_version() != get_plotlyjs_version():
        return False

    def plotly_js():
        return flask.send_file(BUNDLE, mimetype="text/javascript", max_age=24 * 3600)

    server.add_url_rule("/" + PLOTLY_JS, "moeplane_plotly_cartesian", plotly_js)
    return True
