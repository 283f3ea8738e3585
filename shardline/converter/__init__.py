"""HF checkpoint -> shardline.v1 shards (docs/shard-format.md). Entry: `convert()`."""

from shardline.converter.convert import convert

__all__ = ["convert"]
