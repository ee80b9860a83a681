"""Domain types every layer shares: policies and the decision lifecycle. Pure: no I/O."""
