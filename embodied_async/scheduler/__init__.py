"""Scheduling building blocks: worker groups and keyed channels between components. (Where the
components go is the config layer's: ``embodied_async.config.placement`` and ``.topology``.)"""

from embodied_async.scheduler.channel import (
    ChannelClosed,
    ChannelFuture,
    LocalChannel,
    RayChannel,
    create_channel,
)
from embodied_async.scheduler.graph_channels import GraphChannels

__all__ = [
    "ChannelClosed",
    "ChannelFuture",
    "GraphChannels",
    "LocalChannel",
    "RayChannel",
    "create_channel",
]
