"""Sans-IO models of the three wire protocols: Responses, Anthropic Messages, Chat Completions."""
