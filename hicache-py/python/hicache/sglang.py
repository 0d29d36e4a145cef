"""hicache as an SGLang storage backend.

Start SGLang with::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "hicache",
        "module_path": "hicache.sglang", "class_name": "HiCacheBackend",
        "interface_v1": 1, "storage_dir": "/mnt/kv"}'

SGLang builds the class as ``HiCacheBackend(storage_config, kwargs)``, registers its host
pool, then calls ``batch_exists``, ``batch_get_v1`` and ``batch_set_v1`` (at most 128 pages a
call) from its prefetch, prefetch-I/O and backup threads at once. Every call lets go of the
GIL while its I/O runs. The extra config is read by hicache's own strict rules: its keys
(``storage_dir``, ``plugin``, ``use_direct_io``, ``naming``, ...) configure hicache; SGLang's
routing and engine keys are accepted and not passed on; anything else is an error that names
the closest key.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, List, Optional

from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

from hicache._native import Connector

logger = logging.getLogger(__name__)

# Host layouts whose pages hicache can address (SGLang's `page_unified` and
# `page_first_kv_split` are not among them).
SUPPORTED_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")

_FLAT_PATH = (
    "hicache serves SGLang's zero-copy v1 interface only: put \"interface_v1\": 1 in "
    "--hicache-storage-backend-extra-config"
)


@dataclass
class _Metrics:
    """SGLang's ``StorageMetrics`` fields, for when its metrics module cannot be imported."""

    prefetch_pgs: List[int] = field(default_factory=list)
    backup_pgs: List[int] = field(default_factory=list)
    prefetch_bandwidth: List[float] = field(default_factory=list)
    backup_bandwidth: List[float] = field(default_factory=list)


def _storage_metrics():
    try:
        from sglang.srt.observability.metrics_collector import StorageMetrics
    except Exception:  # its module imports the whole server; the fields are the same
        return _Metrics()
    return StorageMetrics()


class _Indices:
    """Token indices as SGLang's host pools read them (``len`` and ``tolist``)."""

    def __init__(self, start: int, count: int):
        self._list = list(range(start, start + count))

    def __len__(self) -> int:
        return len(self._list)

    def tolist(self) -> List[int]:
        return list(self._list)


def _pool_geometry(host_pool) -> dict:
    """hicache's geometry keywords for an SGLang host pool."""
    layout = getattr(host_pool, "layout", None)
    if layout not in SUPPORTED_LAYOUTS:
        raise ValueError(
            f"hicache: host pool layout {layout!r} is not supported; use one of "
            f"{', '.join(SUPPORTED_LAYOUTS)} (--hicache-mem-layout)"
        )
    geometry = dict(
        layers=int(host_pool.layer_num),
        page_tokens=int(host_pool.page_size),
        dtype=str(host_pool.dtype),
        layout=layout,
        pages=int(host_pool.page_num),
    )
    if getattr(host_pool, "kv_cache_dim", None) is not None:
        geometry.update(attention="mla", kv_cache_dim=int(host_pool.kv_cache_dim))
    else:
        geometry.update(
            attention="mha",
            kv_heads=int(host_pool.head_num),
            head_dim=int(host_pool.head_dim),
        )
    return geometry


def _merged(ranges) -> List[tuple]:
    """Byte ranges ``(start, length)`` as sorted, merged ``[start, end)`` intervals."""
    out: List[list] = []
    for start, length in sorted(ranges):
        if out and out[-1][1] == start:
            out[-1][1] = start + length
        else:
            out.append([start, start + length])
    return [tuple(r) for r in out]


class HiCacheBackend(HiCacheStorage):
    """An SGLang storage backend over hicache's connector (one per rank)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        cfg = storage_config
        if getattr(cfg, "dcp_size", 1) > 1:
            raise ValueError(
                "hicache: decode context parallelism (dcp_size > 1) is not supported; "
                "run with dcp_size 1"
            )
        self.storage_config = cfg
        self._metrics_on = bool(getattr(cfg, "enable_storage_metrics", False))
        self._connector = Connector(
            json.dumps(dict(cfg.extra_config or {})),
            model=cfg.model_name or "",
            tp_rank=cfg.tp_rank,
            tp_size=cfg.tp_size,
            pp_rank=cfg.pp_rank,
            pp_size=cfg.pp_size,
            cp_rank=getattr(cfg, "attn_cp_rank", 0),
            cp_size=getattr(cfg, "attn_cp_size", 1),
        )
        self._report: Optional[dict] = None
        self._lock = threading.Lock()
        self._metrics = _Metrics()
        logger.info("hicache: plugin %s", self._connector.plugin)

    # --- registration -------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host) -> None:
        super().register_mem_pool_host(mem_pool_host)
        geometry = _pool_geometry(mem_pool_host)
        buffer = getattr(mem_pool_host, "kv_buffer", None)
        report = self._connector.register_pool(buffer, **geometry)
        if buffer is not None:
            self._cross_check(mem_pool_host, buffer)
        self._report = report
        logger.info(
            "hicache: %s pool registered: %s (%s); namespace %s, %s",
            geometry["layout"],
            report["mode"],
            report["reason"],
            report["namespace"],
            "writer" if report["writer"] else "not a writer (MLA rank > 0)",
        )

    def _cross_check(self, host_pool, buffer) -> None:
        """Checks once that SGLang's own page pointers cover the bytes hicache moves."""
        meta = getattr(host_pool, "get_page_buffer_meta", None)
        if meta is None:
            return
        page = int(host_pool.page_num) - 1
        size = int(host_pool.page_size)
        try:
            ptrs, sizes = meta(_Indices(page * size, size))
        except (NotImplementedError, ValueError, AssertionError, AttributeError) as e:
            logger.debug("hicache: no page pointers to cross-check: %s", e)
            return
        base = _buffer_address(buffer)
        theirs = _merged((int(p) - base, int(n)) for p, n in zip(ptrs, sizes))
        ours = _merged(self._connector.page_spans(page))
        if theirs != ours:
            raise ValueError(
                f"hicache: page {page} of the host pool is at {theirs[:4]} (SGLang's "
                f"pointers, relative to kv_buffer) but hicache's geometry puts it at "
                f"{ours[:4]}; the pool's geometry is not what hicache was told"
            )

    # --- the v1 interface ---------------------------------------------------------

    def batch_exists(
        self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None
    ) -> int:
        return self._connector.batch_exists(list(keys))

    def batch_get_v1(
        self,
        keys: List[str],
        host_indices,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> List[bool]:
        return self._transfer(keys, host_indices, write=False)

    def batch_set_v1(
        self,
        keys: List[str],
        host_indices,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> List[bool]:
        return self._transfer(keys, host_indices, write=True)

    def _transfer(self, keys: List[str], host_indices, write: bool) -> List[bool]:
        keys = list(keys)
        tokens = host_indices.tolist() if hasattr(host_indices, "tolist") else list(host_indices)
        started = time.perf_counter()
        call = self._connector.batch_set if write else self._connector.batch_get
        done, errors = call(keys, tokens)
        elapsed = time.perf_counter() - started
        for i, message in errors:
            logger.warning(
                "hicache: %s of page %s failed: %s", "write" if write else "read", keys[i], message
            )
        if self._metrics_on and self._report is not None:
            pages = sum(done)
            rate = pages * self._report["page_bytes"] / elapsed / 1e9 if elapsed > 0 else 0.0
            with self._lock:
                if write:
                    self._metrics.backup_pgs.append(pages)
                    self._metrics.backup_bandwidth.append(rate)
                else:
                    self._metrics.prefetch_pgs.append(pages)
                    self._metrics.prefetch_bandwidth.append(rate)
        return done

    def exists(self, key: str) -> bool:
        return self._connector.batch_exists([key]) == 1

    # --- SGLang's deprecated flat-tensor path -------------------------------------

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        raise NotImplementedError(_FLAT_PATH)

    def batch_get(
        self, keys: List[str], target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None
    ):
        raise NotImplementedError(_FLAT_PATH)

    def set(
        self,
        key: str,
        value: Optional[Any] = None,
        target_location: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> bool:
        raise NotImplementedError(_FLAT_PATH)

    def batch_set(
        self,
        keys: List[str],
        values: Optional[Any] = None,
        target_locations: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> bool:
        raise NotImplementedError(_FLAT_PATH)

    # --- scheduler-thread calls ---------------------------------------------------

    def clear(self) -> None:
        """Removes every page this backend's namespace holds (SGLang's cache flush); pages of
        other models, ranks and geometries stay. A failure is logged, not raised: SGLang
        calls this from its scheduler."""
        try:
            removed = self._connector.clear()
        except Exception as e:  # the scheduler must not die of a failed flush
            logger.error("hicache: clear failed: %s", e)
            return
        logger.info("hicache: clear removed %d objects", removed)

    def get_stats(self):
        """Pages and GB/s of each call since the last ``get_stats`` (SGLang's
        ``StorageMetrics``), when SGLang runs with storage metrics on."""
        metrics = _storage_metrics()
        with self._lock:
            taken, self._metrics = self._metrics, _Metrics()
        metrics.prefetch_pgs.extend(taken.prefetch_pgs)
        metrics.backup_pgs.extend(taken.backup_pgs)
        metrics.prefetch_bandwidth.extend(taken.prefetch_bandwidth)
        metrics.backup_bandwidth.extend(taken.backup_bandwidth)
        return metrics

    def stats(self) -> dict:
        """hicache's own counters since the backend opened."""
        return self._connector.stats()

    def close(self) -> None:
        self._connector.close()


def _buffer_address(buffer) -> int:
    if hasattr(buffer, "data_ptr"):
        return int(buffer.data_ptr())
    return int(buffer.__array_interface__["data"][0])
