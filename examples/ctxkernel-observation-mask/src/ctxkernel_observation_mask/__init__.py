"""Example third-party strategy for ctxkernel: observation masking."""
