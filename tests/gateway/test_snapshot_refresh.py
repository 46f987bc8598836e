"""The gateway follows control-plane change notices: a channel-layer `config.changed`
message on the `kvroute.config` group, or a Redis pub/sub message on `kvroute:config`,
makes it reload the snapshot at once (the poll is set far away to prove it)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from routing.gateway.config import GatewayConfig
from routing.gateway.snapshot import CONFIG_GROUP, REDIS_CONFIG_CHANNEL, StaticSnapshotSource
from routing.gateway.state import build_gateway_state


def doc(revision: str, *workers: str) -> dict[str, Any]:
    return {
        "revision": revision,
        "workers": [
            {"id": w, "url": f"http://127.0.0.1:9/{w}", "model": "m", "state": "active"}
            for w in workers
        ],
        "models": {},
    }


async def until(predicate: Any, timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_channel_layer_notice_triggers_a_refresh(settings: Any) -> None:
    from channels.layers import channel_layers, get_channel_layer

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends.clear()
    source = StaticSnapshotSource(doc("r1", "a"))
    config = GatewayConfig(metrics_interval_s=0, snapshot_poll_s=600, listen_channel_layer=True)
    state = build_gateway_state(config, snapshot=source)
    await state.start()
    try:
        assert [w.id for w in state.snapshot.workers] == ["a"]
        source.set(doc("r2", "a", "b"))
        await asyncio.sleep(0.1)  # the listener joins the group
        await get_channel_layer().group_send(
            CONFIG_GROUP, {"type": "config.changed", "revision": "r2"}
        )
        await until(lambda: state.snapshot.revision == "r2")
        assert [w.id for w in state.snapshot.workers] == ["a", "b"]
    finally:
        await state.aclose()
        channel_layers.backends.clear()


async def test_redis_pubsub_notice_triggers_a_refresh(redis_url: str) -> None:
    import redis.asyncio as aioredis

    source = StaticSnapshotSource(doc("r1", "a"))
    config = GatewayConfig(metrics_interval_s=0, snapshot_poll_s=600, redis_url=redis_url)
    state = build_gateway_state(config, snapshot=source)
    await state.start()
    client = aioredis.Redis.from_url(redis_url)
    try:
        source.set(doc("r2", "b"))
        deadline = time.monotonic() + 3
        # Publish until the listener has subscribed and reacted.
        while state.snapshot.revision != "r2":
            assert time.monotonic() < deadline, "no refresh after the Redis notice"
            await client.publish(REDIS_CONFIG_CHANNEL, "r2")
            await asyncio.sleep(0.1)
        assert [w.id for w in state.snapshot.workers] == ["b"]
    finally:
        await client.aclose()
        await state.aclose()
