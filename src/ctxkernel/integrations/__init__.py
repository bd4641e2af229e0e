"""Adapters for agent frameworks, one per framework's own context seam (docs/integrations.md).

* :mod:`ctxkernel.integrations.langchain`: ``ContextMiddleware`` for LangChain's ``create_agent``
  (extra ``langchain``);
* :mod:`ctxkernel.integrations.pydantic_ai`: ``ContextProcessor``, a Pydantic AI history
  processor with a toolset (extra ``pydantic-ai``);
* :mod:`ctxkernel.integrations.openai_agents`: ``ContextSession``, an OpenAI Agents SDK
  ``Session`` with a per-call input filter (extra ``openai-agents``).

Each adapter only converts the framework's messages; the shared sequence (reconcile the
framework's history with the log, prepare the managed request, commit the reply, run strategy
tools) lives in ``_core`` and ``_reconcile``. Import an adapter's module directly: this package
imports no framework.
"""

from ._core import ManagedSession, open_kernel, strategy_tool_schemas
from ._reconcile import IntegrationError, LogIndex, reconcile

__all__ = ["IntegrationError", "LogIndex", "ManagedSession", "open_kernel", "reconcile", "strategy_tool_schemas"]
