"""ctxkernel strategy ``decay``: position anchors and model-authored compression.

See the package README for the model's view (anchors, ``compress``, ``drop``) and the settings.
"""

from .plugin import DecaySettings, current_state
from .state import Block, DecayState, replay

__all__ = ["Block", "DecaySettings", "DecayState", "current_state", "replay"]
