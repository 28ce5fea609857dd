"""Builds the plugin manager: entry-point group `modelplex`, an optional allow-list, no globals."""
from __future__ import annotations

import logging
import os
from importlib.metadata import entry_points

import pluggy

from . import hookspecs
from .backend import BackendSpec

log = logging.getLogger(__name__)
ENTRY_POINT_GROUP = "modelplex"


def create_plugin_manager(allow: set[str] | None = None, extra: list[object] = ()) -> pluggy.PluginManager:
    """Load every installed plugin (or only `allow`, default from `MODELPLEX_PLUGINS=a,b`).

    A plugin that fails to import is logged and skipped so one broken package cannot stop the server.
    """
    if allow is None and os.environ.get("MODELPLEX_PLUGINS"):
        allow = {name.strip() for name in os.environ["MODELPLEX_PLUGINS"].split(",") if name.strip()}
    pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
    pm.add_hookspecs(hookspecs)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if allow is not None and ep.name not in allow:
            continue
        if pm.get_plugin(ep.name) is not None:
            continue
        try:
            pm.register(ep.load(), name=ep.name)
        except Exception as e:
            log.warning("plugin %s (%s) failed to load and is skipped: %s", ep.name, ep.value, e,
                        exc_info=log.isEnabledFor(logging.DEBUG))
    for plugin in extra:
        pm.register(plugin)
    pm.check_pending()
    return pm


def collect_backends(pm: pluggy.PluginManager) -> dict[str, BackendSpec]:
    """Backend specs by every name they answer to (name, aliases); first registered wins."""
    by_name: dict[str, BackendSpec] = {}
    for specs in pm.hook.modelplex_backends():
        for spec in specs or ():
            for key in (spec.name, *spec.aliases):
                if key in by_name:
                    log.warning("backend name %s provided twice; keeping the first", key)
                    continue
                by_name[key] = spec
    return by_name
