"""edgellm: quantized on-device LLM inference from plain Python.

`edgellm.load` and `edgellm.LLM` are imported on first use, so that light modules
(`edgellm.errors`, the command-line parser) load without numpy and numba.
"""

from .errors import EdgeLLMError

__version__ = "0.1.0"
__all__ = ["LLM", "load", "EdgeLLMError", "__version__"]


def __getattr__(name: str):
    if name in ("LLM", "load"):
        from . import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'edgellm' has no attribute {name!r}")
