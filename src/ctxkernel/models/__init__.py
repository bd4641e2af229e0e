"""Model adapters: a scripted model (tests, simulation) and an OpenAI-compatible HTTP client."""

from .base import ModelAdapter, Reply
from .openai_http import HTTPModelError, OpenAIChatModel, classify_http_error
from .scripted import ScriptedModel

__all__ = ["HTTPModelError", "ModelAdapter", "OpenAIChatModel", "Reply", "ScriptedModel", "classify_http_error"]
