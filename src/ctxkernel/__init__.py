"""ctxkernel: context management for LLM agent harnesses.

Integrators use :class:`Kernel` and :class:`Session`; strategy authors declare their strategy
with :class:`Strategy` and implement the hooks of :mod:`ctxkernel.hookspecs` with :data:`hookimpl`,
each receiving a :class:`Context` (the session as strategies see it) from which
``STRATEGY.on(ctx)`` gives the strategy's :class:`StrategyHandle`. Test helpers live in
:mod:`ctxkernel.testing`.
"""

from .context import Context, MeterView, SurfaceView
from .controls import MANUAL_ACTIONS, ManualCompaction, ManualOutcome
from .errors import (
    CacheWaitError,
    CompactionBusyError,
    CompactionError,
    ConfigError,
    ConflictError,
    ContextOverflowError,
    ControlError,
    CorruptionError,
    CtxKernelError,
    EventError,
    HeaderTooLargeError,
    ModelError,
    PluginConflictError,
    ProfileError,
    RequestTooLargeError,
    SessionBusyError,
    SessionExistsError,
    SessionNotFoundError,
    ShrinkCheckError,
    StoreError,
    SurfaceChangedError,
    SurfaceError,
    ToolError,
    UnbalancedCutError,
)
from .events import Event
from .handle import Strategy, StrategyBlobs, StrategyChecks, StrategyHandle, StrategyNotes
from .hookspecs import hookimpl
from .kernel import Kernel
from .logging import get_logger
from .loop import AgentLoop, AsyncAgentLoop, AsyncSession, TurnResult
from .messages import Message, ReasoningBlock, Source, TextBlock, ToolCallBlock, ToolResultBlock
from .meter import Pressure
from .models import ModelAdapter, OpenAIChatModel, Reply, ScriptedModel
from .profile import Profile, load_profile
from .report import ValidationReport
from .session import EventSpec, ReplyDraft, Request, RequestHeader, Session, StepContext
from .spans import (
    SUMMARY_SECTIONS,
    CommitResult,
    Region,
    Span,
    Summary,
    balanced_cut_at_or_before,
    head_region,
    whole_surface_but_last,
)
from .spec import NoSettings, StrategySnapshot, StrategySpec
from .store.base import BlobInfo, check_blob_key, check_session_id
from .surface import Node
from .tools import MAX_INT_ARG, CompactTool, Tool, ToolArgs, ToolOutcome, compact_schema

__all__ = [
    "AgentLoop",
    "AsyncAgentLoop",
    "AsyncSession",
    "BlobInfo",
    "CommitResult",
    "CompactTool",
    "CompactionBusyError",
    "CompactionError",
    "ConfigError",
    "ConflictError",
    "Context",
    "ContextOverflowError",
    "ControlError",
    "CorruptionError",
    "CtxKernelError",
    "Event",
    "EventError",
    "EventSpec",
    "Kernel",
    "MANUAL_ACTIONS",
    "ManualCompaction",
    "ManualOutcome",
    "MeterView",
    "Message",
    "ModelAdapter",
    "ModelError",
    "Node",
    "NoSettings",
    "OpenAIChatModel",
    "PluginConflictError",
    "Pressure",
    "Profile",
    "ProfileError",
    "ReasoningBlock",
    "Region",
    "Reply",
    "ReplyDraft",
    "Request",
    "HeaderTooLargeError",
    "RequestHeader",
    "RequestTooLargeError",
    "ScriptedModel",
    "Session",
    "SessionBusyError",
    "SessionExistsError",
    "SessionNotFoundError",
    "ShrinkCheckError",
    "CacheWaitError",
    "Source",
    "Span",
    "StepContext",
    "StoreError",
    "SUMMARY_SECTIONS",
    "Strategy",
    "StrategyBlobs",
    "StrategyChecks",
    "StrategyHandle",
    "StrategyNotes",
    "StrategySnapshot",
    "StrategySpec",
    "Summary",
    "SurfaceChangedError",
    "SurfaceError",
    "SurfaceView",
    "TextBlock",
    "Tool",
    "ToolArgs",
    "ToolCallBlock",
    "ToolError",
    "ToolOutcome",
    "ToolResultBlock",
    "TurnResult",
    "UnbalancedCutError",
    "ValidationReport",
    "MAX_INT_ARG",
    "balanced_cut_at_or_before",
    "check_blob_key",
    "check_session_id",
    "compact_schema",
    "get_logger",
    "head_region",
    "hookimpl",
    "load_profile",
    "whole_surface_but_last",
]
