"""convert-model: Hugging Face directories and GGUF files -> edgellm's packed file."""
