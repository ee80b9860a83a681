"""Memory-offload decisions: keep every device under its watermark at the least step-time cost.

Pure decision code: snapshots in (:class:`DeviceMemory`, :class:`NodeMemory`,
:class:`WatermarkPolicy`), decisions out (:class:`OffloadDecision`), no I/O. The cost model
is in :mod:`moeplane.controlplane.memory.model`, the search in :mod:`moeplane.controlplane.memory.search`.
"""

from moeplane.controlplane.memory.engine import decide_offload
from moeplane.controlplane.memory.types import (
    Action,
    ActionKind,
    AppliedAction,
    DeviceMemory,
    InputError,
    LayerMemory,
    NodeMemory,
    OffloadDecision,
    Verdict,
    WatermarkPolicy,
)

__all__ = [
    "Action",
    "ActionKind",
    "AppliedAction",
    "DeviceMemory",
    "InputError",
    "LayerMemory",
    "NodeMemory",
    "OffloadDecision",
    "Verdict",
    "WatermarkPolicy",
    "decide_offload",
]
