"""shardline: tensor- and pipeline-parallel LLM serving."""
