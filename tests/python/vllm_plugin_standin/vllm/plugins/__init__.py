# SPDX-License-Identifier: Apache-2.0
"""Stand-in for vllm.plugins: general plugins are the entry points of the
group vllm.general_plugins, found through importlib.metadata, filtered by
$VLLM_PLUGINS (comma-separated names) when it is set, loaded and called
once per process. As in vLLM, a plugin that fails to load is logged and
skipped, and an exception a plugin's function raises goes to the caller."""

import logging
import os
from importlib.metadata import entry_points

logger = logging.getLogger(__name__)

GROUP = "vllm.general_plugins"

plugins_loaded = False


def load_plugins_by_group(group):
    """{name: the loaded function} of the group's entry points."""
    allowed = os.environ.get("VLLM_PLUGINS")
    allowed = None if allowed is None else [n.strip() for n in allowed.split(",") if n.strip()]
    loaded = {}
    for ep in entry_points(group=group):
        if allowed is not None and ep.name not in allowed:
            continue
        try:
            loaded[ep.name] = ep.load()
        except Exception:
            logger.exception("Failed to load plugin %s", ep.name)
    return loaded


def load_general_plugins():
    """Call every general plugin, the first time in this process only."""
    global plugins_loaded
    if plugins_loaded:
        return
    plugins_loaded = True
    for func in load_plugins_by_group(GROUP).values():
        func()
