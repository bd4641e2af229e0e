"""Recall capabilities shared by strategies: session notes (:mod:`.notes`) and paged history."""
