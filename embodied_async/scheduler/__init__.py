"""Scheduling building blocks: component placement and keyed channels between components."""

from embodied_async.scheduler.channel import (
    ChannelClosed,
    ChannelFuture,
    LocalChannel,
    RayChannel,
    create_channel,
)
from embodied_async.scheduler.graph_channels import GraphChannels
from embodied_async.scheduler.placement import (
    PlacementError,
    detect_num_gpus,
    parse_device_ids,
    parse_placement,
)

__all__ = [
    "ChannelClosed",
    "ChannelFuture",
    "GraphChannels",
    "LocalChannel",
    "PlacementError",
    "RayChannel",
    "create_channel",
    "detect_num_gpus",
    "parse_device_ids",
    "parse_placement",
]
