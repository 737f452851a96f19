"""The catalog of known models (installed as the package `edgellm.models`)."""
