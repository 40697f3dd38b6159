"""What the Gemini tests share: the SDK client, a key of the real shape, a model."""

from __future__ import annotations

from typing import Any

# A fake key of the real shape (AIza and 35 more), so redaction meets a real one.
GEMINI_KEY = "AIzaFakeTestKey0123456789abcdefghijklmn"
MODEL = "gemini-2.5-flash"


def genai_client(base_url: str, api_key: str = GEMINI_KEY) -> Any:
    """The official SDK with no retries, its base URL the fake or a gateway."""
    from google import genai
    from google.genai import types

    options = types.HttpOptions(base_url=base_url, retry_options=None)
    return genai.Client(api_key=api_key, http_options=options)
