"""Client-side helpers for the serve tests: an agent that keeps its whole history and talks to
``serve`` through the official SDK of one API, streaming or not."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

READ_FILE_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string", "description": "file to read"}},
    "required": ["path"],
}


def big_result(i: int, lines: int = 40) -> str:
    """A large tool result (about 15 tokens a line), distinct per call."""
    return "".join(f"line {j}: def function_{i}_{j}(value): return value * {j} + {i}\n" for j in range(lines))


@dataclass
class Agent:
    """A client that sends its whole history every time, as real agents do."""

    api: str
    client: Any
    stream: bool = False
    model: str = "fake-model"
    system: str = "You are the test agent."
    history: list[dict[str, Any]] = field(default_factory=list)
    with_tools: bool = True

    @property
    def tools(self) -> list[dict[str, Any]]:
        if not self.with_tools:
            return []
        if self.api == "openai":
            return [
                {
                    "type": "function",
                    "function": {"name": "read_file", "description": "Read a file", "parameters": READ_FILE_SCHEMA},
                }
            ]
        return [{"name": "read_file", "description": "Read a file", "input_schema": READ_FILE_SCHEMA}]

    def user(self, text: str) -> None:
        self.history.append({"role": "user", "content": text})

    def results(self, results: list[tuple[str, str]]) -> None:
        if self.api == "openai":
            self.history += [{"role": "tool", "tool_call_id": call_id, "content": text} for call_id, text in results]
        else:
            self.history.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": call_id, "content": text} for call_id, text in results
                    ],
                }
            )

    def step(self, **extra: Any) -> tuple[str, list[tuple[str, str, Any]]]:
        """One request; the reply is appended to the history. Returns its text and calls."""
        message = self._openai(**extra) if self.api == "openai" else self._anthropic(**extra)
        self.history.append(message)
        return text_of(self.api, message), calls_of(self.api, message)

    def _openai(self, **extra: Any) -> dict[str, Any]:
        messages = [{"role": "system", "content": self.system}, *self.history]
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages, **extra}
        if self.tools:
            kwargs["tools"] = self.tools
        if not self.stream:
            reply = self.client.chat.completions.create(**kwargs)
            self.last_usage = reply.usage
            return reply.choices[0].message.model_dump(exclude_none=True)
        text, calls = "", {}
        self.last_usage = None
        for chunk in self.client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}):
            if chunk.usage:
                self.last_usage = chunk.usage
            for choice in chunk.choices:
                delta = choice.delta
                text += delta.content or ""
                for tc in delta.tool_calls or []:
                    call = calls.setdefault(
                        tc.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                    )
                    call["id"] = tc.id or call["id"]
                    if tc.function is not None:
                        call["function"]["name"] += tc.function.name or ""
                        call["function"]["arguments"] += tc.function.arguments or ""
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            assert sorted(calls) == list(range(len(calls))), f"tool call indexes must count from 0: {sorted(calls)}"
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        return message

    def _anthropic(self, **extra: Any) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "max_tokens": 1024,
            "system": self.system,
            "messages": self.history,
            **extra,
        }
        if self.tools:
            kwargs["tools"] = self.tools
        if not self.stream:
            reply = self.client.messages.create(**kwargs)
        else:
            with self.client.messages.stream(**kwargs) as stream:
                for _ in stream:
                    pass
                reply = stream.get_final_message()
        self.last_usage = reply.usage
        self.last_stop = reply.stop_reason
        return {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]}


def text_of(api: str, message: dict[str, Any]) -> str:
    if api == "openai":
        return message.get("content") or ""
    return "".join(b.get("text", "") for b in message["content"] if b["type"] == "text")


def calls_of(api: str, message: dict[str, Any]) -> list[tuple[str, str, Any]]:
    import orjson

    if api == "openai":
        return [
            (c["id"], c["function"]["name"], orjson.loads(c["function"]["arguments"] or "{}"))
            for c in message.get("tool_calls") or []
        ]
    return [(b["id"], b["name"], b["input"]) for b in message["content"] if b["type"] == "tool_use"]
