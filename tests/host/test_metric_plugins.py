"""Collectors from the `modelplex_metric_collectors` hook land on each server's own registry and page."""
from __future__ import annotations

import asyncio

import httpx
from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily

import modelplex
from modelplex.core.plugins import create_plugin_manager
from modelplex.core.settings import ServerConfig
from modelplex.server.assembly import Server


class ServerNameGauge:
    """Reads the data plane it was built over at scrape time, as a backend's collector does."""

    def __init__(self, dataplane, value: float):
        self.dataplane, self.value = dataplane, value

    def describe(self):
        yield GaugeMetricFamily("plugin_probe", "A plugin's gauge", labels=["server"])

    def collect(self):
        family = GaugeMetricFamily("plugin_probe", "A plugin's gauge", labels=["server"])
        family.add_metric([self.dataplane.metadata()["name"]], self.value)
        yield family


class ProbePlugin:
    def __init__(self, value: float):
        self.value = value

    @modelplex.hookimpl
    def modelplex_metric_collectors(self, dataplane):
        return [ServerNameGauge(dataplane, self.value)]


def test_each_server_renders_its_own_plugin_collectors_and_a_clash_is_skipped(tmp_path):
    async def scenario():
        pages = []
        # The second server has two plugins claiming the same family: one keeps it, the other is skipped.
        for plugins in ([ProbePlugin(1.0)], [ProbePlugin(2.0), ProbePlugin(3.0)]):
            settings = ServerConfig(model_repositories=[tmp_path], host="127.0.0.1", metrics_port=0,
                                    allow_http=False, allow_grpc=False)
            server = Server(settings, create_plugin_manager(allow=set(), extra=plugins))
            await server.start()
            try:
                async with httpx.AsyncClient() as client:
                    pages.append((await client.get(f"http://127.0.0.1:{server.ports['metrics']}/metrics")).text)
            finally:
                await server.stop()
        return pages

    first, second = asyncio.run(scenario())
    assert 'plugin_probe{server="modelplex"} 1.0' in first
    probes = [line for line in second.splitlines() if line.startswith("plugin_probe{")]
    assert len(probes) == 1, probes  # not two series of one family
    assert "plugin_probe" not in {name for collector in REGISTRY._collector_to_names.values() for name in collector}
