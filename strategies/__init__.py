"""Server-side unlearning methods (Flower strategies) and their pure aggregation math.

Importing this package hands the plug-in kinds the methods register to ``tasks.plugins`` (which
sits below the methods and cannot import them)."""

from tasks.plugins import use_plugin_builders


def _plugin_builder(kind: str):
    from strategies.registry import plugin_builder

    return plugin_builder(kind)


use_plugin_builders(_plugin_builder)
