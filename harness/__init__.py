"""Scaffolding shared by ``tests/`` and ``benchmarks/`` (not installed): synthetic expert-load
traces (:mod:`.traces`), the exact routing reference (:mod:`.routing_lp`), a simulated job
written straight into a store (:mod:`.simjob`) and the dashboard served in a thread for a
headless Chromium (:mod:`.browser`). Processes and deadline polls are the product's
``moeplane.controlplane.procs``. Tests and benchmarks import from here, never from each other."""
