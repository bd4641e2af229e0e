"""Model adapters: a scripted model (tests, simulation) and an OpenAI-compatible HTTP client."""

from .base import ModelAdapter, Reply
from .scripted import ScriptedModel

__all__ = ["ModelAdapter", "Reply", "ScriptedModel"]
