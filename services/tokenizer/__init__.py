"""The tokenizer deployable: encode, chat templates, incremental detokenization.

`TokenizerService` is the plain object (tests drive it directly); `server.py` is its thin gRPC
front; `python -m shardline.tokenizer --model DIR --address HOST:PORT` runs it.
"""

from .detokenizer import IncrementalDetokenizer
from .service import ChatPrompt, TokenizerInfo, TokenizerService

__all__ = ["ChatPrompt", "IncrementalDetokenizer", "TokenizerInfo", "TokenizerService"]
