"""RL post-training observability, pure: phase vocabulary, span tables, idle ("black hole")
analysis and trace export. Arrays in, arrays and dataclasses out; no I/O, no clock."""
