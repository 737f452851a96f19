"""edgellm: quantized on-device LLM inference from plain Python."""

from .errors import EdgeLLMError
from .llm import LLM, load

__version__ = "0.1.0"
__all__ = ["LLM", "load", "EdgeLLMError", "__version__"]
