"""hicache: a fast, safe storage tier (L3) for LLM KV-cache pages.

``hicache.Connector`` is one rank's connector (the Rust extension ``hicache._native``);
``hicache.sglang.HiCacheBackend`` is the SGLang storage backend built on it. The SGLang
module is imported only when asked for, so this package does not need SGLang.
"""

from hicache._native import Connector, HiCacheError, __version__

__all__ = ["Connector", "HiCacheError", "__version__"]
