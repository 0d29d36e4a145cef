"""hicache as an SGLang storage backend.

Start SGLang with::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "hicache",
        "module_path": "hicache.sglang", "class_name": "HiCacheBackend",
        "interface_v1": 1, "storage_dir": "/mnt/kv"}'

SGLang builds the class as ``HiCacheBackend(storage_config, kwargs)``, registers its host
pool, then calls ``batch_exists``, ``batch_get_v1`` and ``batch_set_v1`` (at most 128 pages a
call) from its prefetch, prefetch-I/O and backup threads at once. Hybrid models (Mamba,
sliding-window, indexer and DeepSeek-V4 pools) also register their sidecar pools with
``register_mem_host_pool_v2`` and move them with ``batch_exists_v2``, ``batch_get_v2`` and
``batch_set_v2``. Every call lets go of the
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, List, Optional

from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolTransfer,
    PoolTransferResult,
)

from hicache._native import Connector, HiCacheError

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


def _extra_config_text(extra) -> str:
    """SGLang's extra config as the text the connector reads: a mapping as JSON, or text
    (inline JSON, or ``@path`` of a file) as it is. A value JSON cannot hold is an error
    naming its key, instead of ``json``'s message about a type."""
    if extra is None:
        return "{}"
    if isinstance(extra, str):
        return extra
    if not isinstance(extra, Mapping):
        raise HiCacheError(
            f"hicache: extra_config is a {type(extra).__name__}; give a dict, JSON text or "
            "@path of a config file"
        )
    for key, value in extra.items():
        try:
            json.dumps({key: value}, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise HiCacheError(
                f"hicache: extra_config key {key!r} holds a {type(value).__name__}, which "
                f"is not a JSON value ({e}); give a string, number, bool, list or dict"
            ) from None
    return json.dumps(dict(extra), allow_nan=False)


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
            _extra_config_text(cfg.extra_config),
            model=cfg.model_name or "",
            tp_rank=cfg.tp_rank,
            tp_size=cfg.tp_size,
            pp_rank=cfg.pp_rank,
            pp_size=cfg.pp_size,
            cp_rank=getattr(cfg, "attn_cp_rank", 0),
            cp_size=getattr(cfg, "attn_cp_size", 1),
        )
        self._report: Optional[dict] = None
        self._sidecars: dict = {}
        self._copies: dict = {}
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

    # --- hybrid models: sidecar pools and the v2 interface -------------------------

    def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
        """Registers a sidecar pool (Mamba state, sliding-window KV, indexer, DeepSeek-V4
        pools) beside the KV pool. Where SGLang's own page pointers exist
        (``get_hybrid_pool_buffer`` and ``get_page_buffer_meta``) its pages move in place, laid
        out as those pointers say; otherwise they are copied through staging slots with the
        pool's ``get_data_page`` / ``set_from_flat_data_page`` (SGLang's flat page), as
        SGLang's NIXL backend does. ``kv`` is the pool ``register_mem_pool_host`` registered
        and is not registered again."""
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        name = _pool_name(host_pool_name)
        if name == "kv":
            return
        # Mamba state is TP-sharded; other sidecars are rank-replicated when the model is.
        replicated = bool(self.storage_config.is_mla_model) and name != "mamba"
        try:
            buffers, layouts, pages = _sidecar_layout(host_pool, name)
            copy = None
            fmt = "; ".join(
                [type(host_pool).__name__] + [str(getattr(b, "dtype", "?")) for b in buffers]
            )
            page_tokens = int(getattr(host_pool, "page_size", 1) or 1)
        except _NoPointers as why:
            copy = _CopySidecar.of(host_pool, name, why)
            buffers, layouts, pages = [copy.staging], [copy.layout()], copy.slots
            fmt = f"{type(host_pool).__name__}; flat page of {copy.page_bytes} bytes"
            page_tokens = 1
        report = self._connector.register_sidecar(
            name,
            buffers,
            layouts,
            page_tokens=page_tokens,
            pages=pages,
            replicated=replicated,
            format=fmt,
        )
        if copy is not None:
            report = dict(report, reason=f"{report['reason']}; {copy.why}")
        with self._lock:
            self._sidecars[name] = report
            if copy is None:
                self._copies.pop(name, None)
            else:
                self._copies[name] = copy
        logger.info(
            "hicache: sidecar %s registered: %s (%s), %d bytes per page, %s",
            name,
            report["mode"],
            report["reason"],
            report["page_bytes"],
            "writer" if report["writer"] else "not a writer (replicated, TP rank > 0)",
        )

    def batch_exists_v2(
        self,
        keys: List[str],
        pool_transfers: Optional[List[PoolTransfer]] = None,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> PoolTransferResult:
        """The KV prefix of ``keys`` and, within it, the prefixes every sidecar in
        ``pool_transfers`` can restore under its hit policy (``all_pages``, or
        ``trailing_pages`` with a window of ``len(transfer.keys)`` pages).
        ``restorable_prefix_pages`` lists every prefix a read would restore in full, so it
        never holds one some pool cannot restore."""
        queries = []
        for t in pool_transfers or []:
            name = _pool_name(t.name)
            if name not in self._sidecars:
                logger.warning("hicache: pool %s is not registered; nothing is restorable", name)
                return PoolTransferResult.empty()
            policy = str(getattr(t.hit_policy, "value", t.hit_policy))
            if policy == "all_pages":
                queries.append((name, policy, 0))
            elif policy == "trailing_pages":
                queries.append((name, policy, max(1, len(t.keys or []))))
            else:
                raise ValueError(f"hicache: unsupported pool hit policy {policy!r} (pool {name})")
        kv_hit, hits, restorable, hit = self._connector.batch_exists_v2(list(keys), queries)
        counts = {"kv": kv_hit} if kv_hit else {}
        counts.update({name: n for name, n in hits if n})
        return PoolTransferResult(hit, counts, restorable_prefix_pages=list(restorable))

    def batch_get_v2(
        self,
        transfers: List[PoolTransfer],
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> dict:
        """Reads each transfer's pages into its pool: ``{pool: [bool per key]}``. A ``kv``
        transfer is read first, and then a sidecar page only if its key is in the KV prefix
        that read restored."""
        return self._transfer_v2(transfers, write=False)

    def batch_set_v2(
        self,
        transfers: List[PoolTransfer],
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> dict:
        """Writes each transfer's pages from its pool: ``{pool: [bool per key]}``."""
        return self._transfer_v2(transfers, write=True)

    def _transfer_v2(self, transfers, write: bool) -> dict:
        direct, copied, results = [], [], {}
        for t in transfers:
            name = _pool_name(t.name)
            keys = list(t.keys or [])
            if t.host_indices is None:
                logger.error("hicache: pool %s transfer without host indices", name)
                results[name] = [False] * len(keys)
                continue
            indices = t.host_indices
            tokens = _token_slots(indices)
            copy = self._copies.get(name)
            (direct if copy is None else copied).append((name, keys, tokens, copy))
        if direct:
            call = self._connector.batch_set_v2 if write else self._connector.batch_get_v2
            answers = call([(n, k, tok) for n, k, tok, _ in direct])
            for (name, keys, _, _), answer in zip(direct, answers):
                results[name] = self._log_failures(name, keys, answer, write)
        # Sidecars without page pointers: only pages whose key the same call's KV read
        # restored are read, as for the others.
        restored = None
        kv = results.get("kv")
        if not write and kv is not None:
            kv_keys = next(k for n, k, _, _ in direct if n == "kv")
            lead = kv.index(False) if False in kv else len(kv)
            restored = set(kv_keys[:lead])
        for name, keys, tokens, copy in copied:
            answer = copy.transfer(self._connector, name, keys, tokens, write, restored)
            results[name] = self._log_failures(name, keys, answer, write)
        return results

    @staticmethod
    def _log_failures(name, keys, answer, write: bool) -> List[bool]:
        done, errors = answer
        for i, message in errors:
            logger.warning(
                "hicache: %s of pool %s page %s failed: %s",
                "write" if write else "read",
                name,
                keys[i],
                message,
            )
        return done

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
        tokens = _token_slots(host_indices)
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


def _token_slots(indices):
    """Host token indices for the native calls: an int64 numpy array where one can be had
    without copying (a CPU torch tensor's ``.numpy()`` view, a numpy array), which the
    binding reads in one copy; otherwise a list."""
    if hasattr(indices, "numpy") and not hasattr(indices, "__array_interface__"):
        try:
            indices = indices.numpy()
        except (RuntimeError, TypeError):  # a tensor numpy cannot view (on a GPU, say)
            return indices.tolist()
    if hasattr(indices, "__array_interface__"):
        return indices
    return indices.tolist() if hasattr(indices, "tolist") else list(indices)


def _pool_name(name) -> str:
    """SGLang's ``PoolName`` (a ``str`` enum) or a plain string, as its value."""
    return str(getattr(name, "value", name))


def _indices(start: int, count: int):
    """Token indices as SGLang's pools take them: an int64 tensor where torch is real."""
    try:
        import torch

        return torch.arange(start, start + count, dtype=torch.int64)
    except (ImportError, AttributeError):  # no torch, or the tests' stand-in module
        return _Indices(start, count)


class _NoPointers(ValueError):
    """A sidecar pool without usable page pointers (it moves through staging instead)."""


class _CopySidecar:
    """A sidecar pool moved through staging slots: each page is copied between the pool and a
    slot with its ``get_data_page`` / ``set_from_flat_data_page`` (SGLang's flat page, the
    bytes SGLang's copy mode stores), and hicache moves the slots. Slots ``0..SLOTS`` serve
    writes and ``SLOTS..2*SLOTS`` reads, each half under its own lock, so the backup thread and
    the prefetch threads never share one; calls of more pages go in chunks."""

    SLOTS = 128

    def __init__(self, host_pool, sample, why: str):
        import numpy as np

        self.pool = host_pool
        self.torch_pages = hasattr(sample, "element_size")
        self.page_dtype = sample.dtype
        if self.torch_pages:
            page_bytes = int(sample.numel()) * int(sample.element_size())
        else:
            page_bytes = int(sample.nbytes)
        self.page_bytes = page_bytes
        self.slots = 2 * self.SLOTS
        self.why = why
        align = 4096
        raw = np.zeros(self.slots * page_bytes + align, dtype=np.uint8)
        at = -raw.__array_interface__["data"][0] % align
        self.staging = raw[at : at + self.slots * page_bytes].reshape(self.slots, page_bytes)
        self.locks = (threading.Lock(), threading.Lock())

    @classmethod
    def of(cls, host_pool, name: str, why: Exception) -> "_CopySidecar":
        needed = ("get_data_page", "set_from_flat_data_page", "get_dummy_flat_data_page")
        missing = [m for m in needed if not hasattr(host_pool, m)]
        if missing:
            raise ValueError(
                f"hicache: hybrid pool {name} ({type(host_pool).__name__}) cannot be served: "
                f"{why}, and it has no {', '.join(missing)} to copy its pages with"
            )
        copy = cls(host_pool, host_pool.get_dummy_flat_data_page(), f"pages copied through staging ({why})")
        if copy.page_bytes <= 0:
            raise ValueError(f"hicache: hybrid pool {name} has empty pages")
        return copy

    def layout(self):
        return (self.page_bytes, [(0, self.page_bytes)])

    def _flat_bytes(self, page):
        """A flat page's bytes as a uint8 numpy array."""
        if self.torch_pages:
            import torch

            return page.contiguous().reshape(-1).view(torch.uint8).cpu().numpy()
        return page.reshape(-1).view("uint8")

    def _as_page(self, row):
        """A slot's bytes as a flat page of the pool's page dtype (what SGLang's copy mode
        hands ``set_from_flat_data_page``)."""
        if self.torch_pages:
            import torch

            return torch.from_numpy(row.copy()).view(self.page_dtype)
        return row.copy().view(self.page_dtype)

    def transfer(self, connector, name, keys, tokens, write, restored):
        """One v2 transfer of this pool through the staging slots: ``(done, errors)``."""
        n = len(keys)
        per = len(tokens) // n if n else 0
        if per * n != len(tokens) or (n and per == 0):
            raise ValueError(
                f"hicache: pool {name}: {n} keys need the same number of host token indices "
                f"each; got {len(tokens)}"
            )
        done, errors = [False] * n, []
        wanted = [i for i in range(n) if write or restored is None or keys[i] in restored]
        base = 0 if write else self.SLOTS
        with self.locks[0 if write else 1]:
            for at in range(0, len(wanted), self.SLOTS):
                chunk = wanted[at : at + self.SLOTS]
                slots = [base + j for j in range(len(chunk))]
                if write:
                    for j, i in enumerate(chunk):
                        flat = self._flat_bytes(self.pool.get_data_page(tokens[i * per], flat=True))
                        if flat.size != self.page_bytes:
                            raise ValueError(
                                f"hicache: pool {name} gave a page of {flat.size} bytes, "
                                f"not {self.page_bytes}"
                            )
                        self.staging[slots[j]] = flat
                call = connector.batch_set_v2 if write else connector.batch_get_v2
                [(ok, failed)] = call([(name, [keys[i] for i in chunk], slots)])
                for j, i in enumerate(chunk):
                    done[i] = ok[j]
                    if ok[j] and not write:
                        self.pool.set_from_flat_data_page(
                            tokens[i * per], self._as_page(self.staging[slots[j]])
                        )
                errors.extend((chunk[j], message) for j, message in failed)
        return done, errors


def _sidecar_layout(host_pool, name: str):
    """A sidecar pool's buffers, each buffer's ``(stride, spans of page 0)``, and its page
    count, read from SGLang's own page pointers for pages 0 and 1; ``_NoPointers`` (saying
    why) where they are missing or do not describe strided pages."""
    get_buffers = getattr(host_pool, "get_hybrid_pool_buffer", None)
    get_meta = getattr(host_pool, "get_page_buffer_meta", None)
    if get_buffers is None or get_meta is None:
        raise _NoPointers("it has no page pointers (get_hybrid_pool_buffer, get_page_buffer_meta)")
    buffers = list(get_buffers() or [])
    if not buffers:
        raise _NoPointers("it exposes no buffers (a pool that does not own its memory)")
    size = int(getattr(host_pool, "page_size", 1) or 1)
    try:
        ptrs0, sizes0 = get_meta(_indices(0, size))
        ptrs1, _ = get_meta(_indices(size, size))
    except (NotImplementedError, ValueError, IndexError, AssertionError) as e:
        raise _NoPointers(f"its page pointers are unavailable: {e}") from e
    ptrs0, ptrs1 = [int(p) for p in ptrs0], [int(p) for p in ptrs1]
    if not ptrs0 or len(ptrs0) != len(ptrs1) or len(sizes0) != len(ptrs0):
        raise _NoPointers(
            f"its pointers for pages 0 and 1 number {len(ptrs0)} and {len(ptrs1)}, not the "
            f"same positive count"
        )
    extents = [(_buffer_address(b), _buffer_bytes(b)) for b in buffers]
    spans = [[] for _ in buffers]
    strides = [None] * len(buffers)
    for p0, p1, n in zip(ptrs0, ptrs1, (int(n) for n in sizes0)):
        owner = next(
            (i for i, (base, length) in enumerate(extents) if base <= p0 and p0 + n <= base + length),
            None,
        )
        stride = p1 - p0
        if owner is None or stride <= 0 or strides[owner] not in (None, stride):
            raise _NoPointers(
                f"a page pointer ({p0:#x}, {n} bytes, next page {p1:#x}) is outside its "
                f"buffers or not one stride per page"
            )
        strides[owner] = stride
        spans[owner].append((p0 - extents[owner][0], n))
    used = [i for i, s in enumerate(spans) if s]
    pages = min(
        (extents[i][1] - max(off + n for off, n in spans[i])) // strides[i] + 1 for i in used
    )
    return (
        [buffers[i] for i in used],
        [(strides[i], spans[i]) for i in used],
        int(pages),
    )


def _buffer_bytes(buffer) -> int:
    if hasattr(buffer, "data_ptr"):
        return int(buffer.numel()) * int(buffer.element_size())
    return int(buffer.nbytes)


def _buffer_address(buffer) -> int:
    if hasattr(buffer, "data_ptr"):
        return int(buffer.data_ptr())
    return int(buffer.__array_interface__["data"][0])
