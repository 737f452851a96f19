"""The command line's choice of decode path, read once from EDGELLM_FUSED: shared by the
commands and the first run's background compile (first_run.py), which runs in a child
process with the parent's value."""

from __future__ import annotations

import os


def fused_default() -> bool:
    """The CLI's one environment choice of the decode path: EDGELLM_FUSED=0 decodes through
    the per-operation path (load(fused=False)); =all through the fused step compiled with
    every op, one kernel for every model (as the test suite runs it: step/fused.py);
    anything else, or unset, the fused step compiled for the model's own ops."""
    value = os.environ.get("EDGELLM_FUSED", "1").strip()
    if value == "all":
        from ..step.fused import FusedDecoder

        FusedDecoder.prune = False
    return value != "0"
