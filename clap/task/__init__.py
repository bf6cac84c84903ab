"""The answer contract every phase shares: the prompt and answer format, the context a model sees, scoring."""
