"""Load generator: many emulated node agents from few processes (``moeplane loadgen``)."""
