"""Loopback servers that speak each provider's wire format (for tests through litellm).

Each checks requests as its provider does, answers in its format (including errors, rate
limits, overloads, refusals and safety blocks) and records what it saw; see the modules.
"""

from providers.anthropic import AnthropicServer
from providers.base import Exchange, Fault, ProviderServer, Reply
from providers.gemini import GeminiServer
from providers.ollama import OllamaServer
from providers.openai_compat import OpenAICompatServer

__all__ = [
    "AnthropicServer",
    "Exchange",
    "Fault",
    "GeminiServer",
    "OllamaServer",
    "OpenAICompatServer",
    "ProviderServer",
    "Reply",
]
