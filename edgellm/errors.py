"""Typed errors. Every failure edgellm reports to a user is one of these, with a one-line message."""


class EdgeLLMError(Exception):
    """Base class of every error edgellm raises on purpose."""


class FormatError(EdgeLLMError):
    """A packed model file is malformed: bad magic, version, header, checksum, offsets."""


class SourceError(EdgeLLMError):
    """A conversion source (HF directory, safetensors, GGUF) is unreadable or inconsistent."""


class QuantizationError(EdgeLLMError):
    """A tensor cannot be quantized (NaN/inf values, shape not divisible by the block)."""


class UnsupportedArchitectureError(EdgeLLMError):
    """The model's architecture is not one edgellm runs."""


class TemplateError(EdgeLLMError):
    """A chat template failed to render or tried something the sandbox forbids."""


class TokenizerError(EdgeLLMError):
    """The tokenizer is missing or cannot be built."""


class ContextError(EdgeLLMError):
    """The prompt or generation does not fit the context window."""


class SamplingError(EdgeLLMError, ValueError):
    """A sampling parameter is out of range."""


class ModelNotFoundError(EdgeLLMError):
    """A model name or path does not resolve to a model."""
