"""Built-in strategies. Each is an ordinary plugin, listed in ``ctxkernel.plugins.DEFAULT_PLUGINS``."""
