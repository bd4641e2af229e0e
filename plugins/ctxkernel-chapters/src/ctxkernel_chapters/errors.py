"""The plugin's storage errors (re-exported by :mod:`ctxkernel_chapters.storage`): a module of
their own so that the registry, which :mod:`ctxkernel_chapters.strategy` imports, raises them
without importing the archive (which imports the strategy)."""

from __future__ import annotations

from ctxkernel import CtxKernelError


class ArchiveError(CtxKernelError):
    """A chapter file, artifact or registry entry could not be written, found, or trusted."""


class NotInArchiveError(ArchiveError):
    """Nothing is stored under that name."""


class PathEscapeError(ArchiveError):
    """A name given to a read tool would leave the archive."""


class IntegrityError(ArchiveError):
    """A stored file's sha256 does not match the registry: it was changed after it was written."""
