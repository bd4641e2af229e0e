"""ctxkernel-mask: observation masking as a shipped strategy.

The strategy module is :mod:`ctxkernel_mask.plugin` (entry point ``mask`` in group
``ctxkernel.strategies``); its profiles are ``mask`` and ``mask-summary``. :func:`plan` says what
a session's next batch would mask, without writing anything.
"""

from .plan import Masking, digest, plan
from .settings import MaskSettings

__all__ = ["MaskSettings", "Masking", "digest", "plan"]
