"""Text in and out of the model: the tokenizer, chat templates, tool calls, reasoning
and constrained output (JSON schema, regex, grammar)."""
