"""hicache's SGLang backend through SGLang's own classes.

``HiCacheStorage`` and ``HiCacheStorageConfig`` come from SGLang's 0.5.23 wheel: the
directory named by ``HICACHE_SGLANG_SOURCE`` holds its ``sglang/srt/mem_cache/
hicache_storage.py`` and ``sglang/srt/environ.py`` (``cargo xtask python`` extracts them).
Those modules import ``torch`` only for type annotations, so a one-line stand-in module is put
first on the path when torch is absent. Host pools are numpy arrays shaped as SGLang's host
pools shape their ``kv_buffer``.
"""

import ast
import ctypes
import hashlib
import json
import os
import pathlib
import socket
import sys
import tempfile
import threading
import types
import typing
import unittest
import urllib.request

import numpy as np

_SOURCE = os.environ.get("HICACHE_SGLANG_SOURCE")
if not _SOURCE:
    raise RuntimeError(
        "set HICACHE_SGLANG_SOURCE to a dir holding SGLang 0.5.23's sglang/ sources "
        "(cargo xtask python does)"
    )
sys.path.insert(0, _SOURCE)
try:
    import torch

    REAL_TORCH = True
except ImportError:
    REAL_TORCH = False
    torch = types.ModuleType("torch")
    torch.Tensor = type("Tensor", (), {})
    sys.modules["torch"] = torch

from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorage,
    HiCacheStorageConfig,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)
from sglang.srt.mem_cache.storage.nixl.nixl_utils import NixlFileManager  # noqa: E402

import hicache  # noqa: E402
from hicache.sglang import HiCacheBackend  # noqa: E402

LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
PAGE = 4  # tokens per page
PAGES = 12
LAYERS = 3


class HostPool:
    """The attributes of SGLang's MHA/MLA host pools that a storage backend reads, over numpy."""

    def __init__(self, layout, mla=False, heads=2, head_dim=16, kv_cache_dim=24, base_at=None):
        self.layout = layout
        self.page_size = PAGE
        self.page_num = PAGES
        self.size = PAGE * PAGES
        self.layer_num = LAYERS
        self.dtype = "torch.float16"
        itemsize = 2
        if mla:
            self.kv_cache_dim = kv_cache_dim
            row = kv_cache_dim
            dims = {
                "layer_first": (LAYERS, self.size, 1, row),
                "page_first": (self.size, LAYERS, 1, row),
                "page_first_direct": (PAGES, LAYERS, PAGE, 1, row),
            }[layout]
        else:
            self.head_num = heads
            self.head_dim = head_dim
            row = heads * head_dim
            dims = {
                "layer_first": (2, LAYERS, self.size, heads, head_dim),
                "page_first": (2, self.size, LAYERS, heads, head_dim),
                "page_first_direct": (2, PAGES, LAYERS, PAGE, heads, head_dim),
                "page_head": (2, PAGES, heads, PAGE, LAYERS, head_dim),
            }[layout]
        self.mla = mla
        self.row_bytes = row * itemsize
        self.kv_buffer = np.zeros(dims, dtype=np.float16)
        if base_at is not None:  # (align, offset): a base `offset` bytes past a multiple of align
            align, offset = base_at
            n = self.kv_buffer.nbytes
            raw = np.zeros(n + align + offset, dtype=np.uint8)
            at = -raw.__array_interface__["data"][0] % align + offset
            self.kv_buffer = raw[at : at + n].view(np.float16).reshape(dims)

    def bytes(self):
        return self.kv_buffer.reshape(-1).view(np.uint8)

    def token_rows(self, page):
        """Every byte range of `page` in the buffer (SGLang's own arithmetic)."""
        size, rb = self.size, self.row_bytes
        first = page * PAGE
        halves = 1 if self.mla else 2
        half = LAYERS * size * rb
        out = []
        for kv in range(halves):
            for layer in range(LAYERS):
                for t in range(first, first + PAGE):
                    if self.layout == "layer_first":
                        at = layer * size * rb + t * rb
                    elif self.layout == "page_first":
                        at = t * LAYERS * rb + layer * rb
                    elif self.layout == "page_first_direct":
                        at = (page * LAYERS + layer) * PAGE * rb + (t - first) * rb
                    else:  # page_head: heads outermost inside a page
                        out.extend(self._head_rows(kv, page, layer, t - first))
                        continue
                    out.append((kv * half + at, rb))
        return out

    def _head_rows(self, kv, page, layer, tok):
        hd = self.head_dim * 2
        half = LAYERS * self.size * self.row_bytes
        rows = []
        for h in range(self.head_num):
            at = (((page * self.head_num + h) * PAGE + tok) * LAYERS + layer) * hd
            rows.append((kv * half + at, hd))
        return rows

    def _base(self):
        return self.kv_buffer.__array_interface__["data"][0]

    def get_data_page(self, index, flat=True):
        """SGLang's flat page (spec: token-sliced layouts slice tokens, the page layouts slice
        the page), as C-order bytes: what its copy mode writes and reads."""
        i, buf = index, self.kv_buffer
        if self.mla:
            part = {
                "layer_first": lambda: buf[:, i : i + PAGE],
                "page_first": lambda: buf[i : i + PAGE],
                "page_first_direct": lambda: buf[i // PAGE],
            }[self.layout]()
        else:
            part = {
                "layer_first": lambda: buf[:, :, i : i + PAGE],
                "page_first": lambda: buf[:, i : i + PAGE],
                "page_first_direct": lambda: buf[:, i // PAGE],
                "page_head": lambda: buf[:, i // PAGE],
            }[self.layout]()
        return np.ascontiguousarray(part).reshape(-1)

    def get_page_buffer_meta(self, indices):
        """SGLang's zero-copy pointers (page_first / page_first_direct only, as SGLang)."""
        if self.layout not in ("page_first", "page_first_direct"):
            raise ValueError(f"Unsupported layout: {self.layout}")
        base = self._base()
        idx = indices.tolist()
        ptrs, sizes = [], []
        page_bytes = LAYERS * PAGE * self.row_bytes
        for i in range(0, len(idx), PAGE):
            k = base + idx[i] * LAYERS * self.row_bytes
            ptrs.append(k)
            sizes.append(page_bytes)
            if not self.mla:
                ptrs.append(k + LAYERS * self.size * self.row_bytes)
                sizes.append(page_bytes)
        return ptrs, sizes


class TorchHostPool(HostPool):
    """The same pool over a pinned (where CUDA is present) bfloat16 torch tensor, as SGLang
    allocates its host pools; bytes are read and written through a numpy view of it."""

    def __init__(self, layout, mla=False):
        super().__init__(layout, mla=mla)
        pin = torch.cuda.is_available()
        self.kv_buffer = torch.zeros(self.kv_buffer.shape, dtype=torch.bfloat16, pin_memory=pin)
        self.dtype = torch.bfloat16
        self.pinned = pin

    def bytes(self):
        return self.kv_buffer.view(-1).view(torch.uint8).numpy()

    def _base(self):
        return self.kv_buffer.data_ptr()


def fill_page(pool, page, seed):
    raw = pool.bytes()
    for at, n in pool.token_rows(page):
        raw[at : at + n] = (np.arange(n, dtype=np.uint32) * 7 + seed + at).astype(np.uint8)


def page_bytes(pool, page):
    raw = pool.bytes()
    return b"".join(raw[at : at + n].tobytes() for at, n in pool.token_rows(page))


def tokens(pages):
    return np.array([p * PAGE + t for p in pages for t in range(PAGE)], dtype=np.int64)


def config(root, mla=False, tp_rank=0, tp_size=1, extra=None, metrics=False):
    extra_config = {
        "backend_name": "hicache",
        "module_path": "hicache.sglang",
        "class_name": "HiCacheBackend",
        "interface_v1": 1,
        "storage_dir": root,
    }
    extra_config.update(extra or {})
    return HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=mla,
        enable_storage_metrics=metrics,
        is_page_first_layout=False,
        model_name="org/model-7b",
        extra_config=extra_config,
    )


class Backend(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        # A cleanup, not tearDown: it must run after the backends' own cleanups close them.
        self.addCleanup(self.dir.cleanup)
        self.root = self.dir.name

    def open(self, pool, **kw):
        backend = HiCacheBackend(config(self.root, mla=pool.mla if pool else False, **kw), {})
        if pool is not None:
            backend.register_mem_pool_host(pool)
        self.addCleanup(backend.close)
        return backend

    def test_is_an_sglang_storage_backend(self):
        self.assertTrue(issubclass(HiCacheBackend, HiCacheStorage))
        backend = self.open(HostPool("page_first"))
        for flat in (lambda: backend.get("k"), lambda: backend.set("k", None),
                     lambda: backend.batch_get(["k"]), lambda: backend.batch_set(["k"], [None])):
            with self.assertRaisesRegex(NotImplementedError, "interface_v1"):
                flat()

    def test_round_trip_every_layout_mha_and_mla(self):
        for mla in (False, True):
            for layout in LAYOUTS:
                if mla and layout == "page_head":
                    continue
                with self.subTest(mla=mla, layout=layout):
                    pool = HostPool(layout, mla=mla)
                    backend = self.open(pool, extra={"storage_dir": os.path.join(self.root, f"{layout}-{mla}")})
                    for p in range(4):
                        fill_page(pool, p, seed=p + 1)
                    written = [page_bytes(pool, p) for p in range(4)]
                    keys = [f"{layout}-{mla}-{p:064x}" for p in range(4)]
                    self.assertEqual(backend.batch_exists(keys), 0)
                    self.assertEqual(backend.batch_set_v1(keys, tokens(range(4))), [True] * 4)
                    self.assertEqual(backend.batch_exists(keys + ["absent"]), 4)
                    self.assertTrue(backend.exists(keys[2]))
                    got = backend.batch_get_v1(keys[:3] + ["absent"], tokens(range(6, 10)))
                    self.assertEqual(got, [True, True, True, False])
                    for p in range(3):
                        self.assertEqual(page_bytes(pool, 6 + p), written[p], f"page {p}")

    def test_three_threads_at_once(self):
        pool = HostPool("page_first_direct")
        backend = self.open(pool)
        failures = []

        def worker(t):
            try:
                src, dst = [t * 2, t * 2 + 1], [6 + t * 2, 7 + t * 2]
                keys = [f"thread{t}-{i}" for i in range(2)]
                for round_ in range(20):
                    for p in src:
                        fill_page(pool, p, seed=round_ * 10 + p)
                    want = [page_bytes(pool, p) for p in src]
                    assert backend.batch_set_v1(keys, tokens(src)) == [True, True]
                    assert backend.batch_exists(keys) == 2
                    assert backend.batch_get_v1(keys, tokens(dst)) == [True, True]
                    assert [page_bytes(pool, p) for p in dst] == want, f"thread {t} round {round_}"
            except Exception as e:  # reported below
                failures.append(repr(e))

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(3)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        self.assertEqual(failures, [])

    def test_mla_ranks_other_than_zero_do_not_write(self):
        pools = [HostPool("page_first", mla=True) for _ in range(2)]
        rank0 = self.open(pools[0], tp_rank=0, tp_size=2)
        rank1 = self.open(pools[1], tp_rank=1, tp_size=2)
        fill_page(pools[1], 0, seed=9)
        self.assertEqual(rank1.batch_set_v1(["only-rank1"], tokens([0])), [True])
        self.assertEqual(rank1.batch_exists(["only-rank1"]), 0, "rank 1 must not store MLA pages")
        fill_page(pools[0], 1, seed=5)
        self.assertEqual(rank0.batch_set_v1(["shared"], tokens([1])), [True])
        self.assertEqual(rank1.batch_get_v1(["shared"], tokens([2])), [True])
        self.assertEqual(page_bytes(pools[1], 2), page_bytes(pools[0], 1))

    def test_logical_anchor_pool(self):
        pool = HostPool("page_first")
        pool.kv_buffer = None
        backend = self.open(pool)
        keys = ["anchor-0", "anchor-1"]
        self.assertEqual(backend.batch_set_v1(keys, tokens([0, 1])), [True, True])
        self.assertEqual(backend.batch_exists(keys), 2)
        self.assertEqual(backend.batch_get_v1(keys, tokens([2, 3])), [True, True])

    def test_clear_takes_this_namespace_only(self):
        mine, other = HostPool("page_first"), HostPool("page_first")
        backend = self.open(mine)
        cfg = config(self.root)
        cfg.model_name = "org/another-model"
        neighbour = HiCacheBackend(cfg, {})
        self.addCleanup(neighbour.close)
        neighbour.register_mem_pool_host(other)
        keys = ["c0", "c1"]
        self.assertEqual(backend.batch_set_v1(keys, tokens([0, 1])), [True, True])
        self.assertEqual(neighbour.batch_set_v1(keys, tokens([0, 1])), [True, True])
        backend.clear()
        self.assertEqual(backend.batch_exists(keys), 0)
        self.assertEqual(neighbour.batch_exists(keys), 2, "another model's pages stay")

    def test_storage_metrics(self):
        pool = HostPool("page_first")
        backend = self.open(pool, metrics=True)
        backend.batch_set_v1(["m0", "m1"], tokens([0, 1]))
        backend.batch_get_v1(["m0", "m1", "none"], tokens([2, 3, 4]))
        stats = backend.get_stats()
        self.assertEqual(stats.backup_pgs, [2])
        self.assertEqual(stats.prefetch_pgs, [2])
        self.assertEqual(len(stats.backup_bandwidth), 1)
        self.assertGreater(stats.prefetch_bandwidth[0], 0)
        self.assertEqual(backend.get_stats().backup_pgs, [], "get_stats drains")
        own = backend.stats()
        self.assertEqual((own["pages_written"], own["pages_hit"], own["pages_not_found"]), (2, 2, 1))


    def test_prometheus_exporter(self):
        # The process's one exporter, from the extra config; scraped before and after.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        pool = HostPool("page_first")
        backend = self.open(pool, extra={"metrics_listen": f"127.0.0.1:{port}"})

        def scrape():
            url = f"http://127.0.0.1:{port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as r:
                text = r.read().decode()
            return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines() if line and not line.startswith("#")}

        before = scrape()
        backend.batch_set_v1(["p0", "p1"], tokens([0, 1]))
        backend.batch_get_v1(["p0", "p1", "none"], tokens([2, 3, 4]))
        after = scrape()
        delta = lambda series: after.get(series, 0) - before.get(series, 0)
        self.assertEqual(delta('hicache_pages_written_total{backend="POSIX"}'), 2)
        self.assertEqual(delta('hicache_page_hits_total{backend="POSIX"}'), 2)
        self.assertEqual(delta('hicache_page_misses_total{backend="POSIX",reason="not_found"}'), 1)


@unittest.skipUnless(REAL_TORCH, "needs torch, which is not installed here")
class TorchTensors(unittest.TestCase):
    """Host pools as SGLang allocates them: torch tensors, pinned where CUDA is present."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        # A cleanup, not tearDown: it must run after the backends' own cleanups close them.
        self.addCleanup(self.dir.cleanup)
        self.root = self.dir.name

    def test_round_trip_every_layout_with_tensors(self):
        for mla in (False, True):
            for layout in LAYOUTS:
                if mla and layout == "page_head":
                    continue
                with self.subTest(mla=mla, layout=layout):
                    pool = TorchHostPool(layout, mla=mla)
                    root = os.path.join(self.root, f"{layout}-{mla}")
                    backend = HiCacheBackend(config(root, mla=mla), {})
                    self.addCleanup(backend.close)
                    backend.register_mem_pool_host(pool)
                    for p in range(4):
                        fill_page(pool, p, seed=p + 3)
                    written = [page_bytes(pool, p) for p in range(4)]
                    keys = [f"t-{p:064x}" for p in range(4)]
                    idx = torch.tensor(tokens(range(4)), dtype=torch.int64)
                    self.assertEqual(backend.batch_set_v1(keys, idx), [True] * 4)
                    self.assertEqual(backend.batch_exists(keys), 4)
                    into = torch.tensor(tokens(range(6, 10)), dtype=torch.int64)
                    self.assertEqual(backend.batch_get_v1(keys, into), [True] * 4)
                    for p in range(4):
                        self.assertEqual(page_bytes(pool, 6 + p), written[p])

    def test_gpu_tensors_are_refused(self):
        if not torch.cuda.is_available():
            self.skipTest("no CUDA device")
        backend = HiCacheBackend(config(self.root), {})
        self.addCleanup(backend.close)
        pool = TorchHostPool("page_first")
        pool.kv_buffer = pool.kv_buffer.cuda()
        with self.assertRaisesRegex(hicache.HiCacheError, "cuda"):
            backend.register_mem_pool_host(pool)


def sglang_nixl_naming():
    """SGLang's ``HiCacheNixl`` object naming, run from SGLang's own source.

    ``hicache_nixl.py`` imports nixl and torch when loaded, so the code that names objects is
    lifted from its syntax tree instead: ``_parse_storage_dirs``, the statements of
    ``HiCacheNixl.__init__`` that set the key suffixes, and the methods ``_get_suffixed_key``,
    ``_get_key_list_from_meta`` and the hybrid pools' ``_get_component_key(s)`` and
    ``_get_hybrid_component_keys``. Paths come from its ``NixlFileManager`` (imported as it
    is: it needs only SGLang's ``environ`` and ``nixl_routing`` modules).
    """
    path = os.path.join(_SOURCE, "sglang/srt/mem_cache/storage/nixl/hicache_nixl.py")
    with open(path) as f:
        tree = ast.parse(f.read())
    parse_dirs = next(
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_parse_storage_dirs"
    )
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "HiCacheNixl")
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    naming_names = ("model_name", "tp_config_suffix", "config_suffix", "is_mla_model")

    def names_a_suffix(stmt):
        if isinstance(stmt, ast.Assign):
            text = " ".join(ast.unparse(t) for t in stmt.targets)
            return any(n in text for n in naming_names)
        if isinstance(stmt, ast.If):
            return any(names_a_suffix(s) for s in stmt.body + stmt.orelse)
        return False

    init = [ast.unparse(s) for s in methods["__init__"].body if names_a_suffix(s)]
    source = "\n".join(
        [ast.unparse(parse_dirs), "class Naming:", "    def __init__(self, storage_config):"]
        + ["        " + line for stmt in init for line in stmt.splitlines()]
        + [
            "\n".join("    " + line for line in ast.unparse(methods[m]).splitlines())
            for m in (
                "_get_suffixed_key",
                "_get_key_list_from_meta",
                "_get_component_key",
                "_get_component_keys",
                "_get_hybrid_component_keys",
            )
        ]
    )
    scope = {"PoolName": PoolName, "List": typing.List, "Optional": typing.Optional, "os": os}
    exec(compile(source, path, "exec"), scope)  # noqa: S102 - SGLang's own code, as shipped
    return scope["_parse_storage_dirs"], scope["Naming"]


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def write_file(path, data):
    with open(path, "wb") as f:
        f.write(data)


class NixlInterop(unittest.TestCase):
    """Pages cross between hicache (``naming = "sglang"``, ``page_format = "raw"``) and
    SGLang's NIXL file backend in both directions, on disk.

    SGLang's side is its own naming and routing code (see ``sglang_nixl_naming``) with the
    bytes its transfers move: the pointers of ``get_page_buffer_meta`` in zero-copy mode, the
    flat page of ``get_data_page`` in copy mode, ``0x01`` markers for an anchor pool. NIXL
    itself is not run: it is not on the package index for CI's Python.
    """

    def setUp(self):
        self.parse_dirs, self.Naming = sglang_nixl_naming()
        self.parents = [tempfile.mkdtemp()]
        if os.path.isdir("/dev/shm"):  # tmpfs: no O_DIRECT, which SGLang's rule ignores
            self.parents.append(tempfile.mkdtemp(dir="/dev/shm"))

    def tearDown(self):
        import shutil

        for p in self.parents:
            shutil.rmtree(p, ignore_errors=True)

    def sglang_zero_copy(self, pool, direct):
        """HiCacheNixl.register_mem_pool_host's decision: its two page layouts, and under
        O_DIRECT only a 4096-aligned base and page stride (``is_stride_page_aligned``)."""
        if pool.kv_buffer is None or pool.layout not in ("page_first", "page_first_direct"):
            return False
        stride = LAYERS * PAGE * pool.row_bytes
        return not direct or (pool._base() % 4096 == 0 and stride % 4096 == 0)

    def sglang_objects(self, naming, pool, keys, pages, direct):
        """(storage key, page bytes) of each object SGLang's batch_set_v1 would write."""
        if pool.kv_buffer is None:
            marker = b"\x01" * (4096 if direct else 1)
            return [(naming._get_suffixed_key(k), marker) for k in keys]
        if self.sglang_zero_copy(pool, direct):
            ptrs, sizes = pool.get_page_buffer_meta(tokens(pages))
            names = naming._get_key_list_from_meta(keys)
            self.assertEqual(len(names), len(ptrs))
            return [(n, ctypes.string_at(p, size)) for n, p, size in zip(names, ptrs, sizes)]
        return [
            (naming._get_suffixed_key(k), pool.get_data_page(p * PAGE).tobytes())
            for k, p in zip(keys, pages)
        ]

    def cases(self):
        """Every layout, MHA and MLA, and an anchor pool; buffered and O_DIRECT; a host pool
        at a 4096-aligned base (zero-copy under SGLang's O_DIRECT rule) and one whose base is
        only 64-aligned (copy mode under that rule)."""
        for parent in self.parents:
            for direct in (False, True):
                for mla in (False, True):
                    for layout in LAYOUTS + ("anchor",):
                        for aligned in (True, False):
                            if not (mla and layout == "page_head"):
                                yield parent, direct, mla, layout, aligned

    def open_both(self, parent, direct, mla, layout, aligned):
        tag = f"{'mla' if mla else 'mha'}-{layout}-{int(direct)}-{int(aligned)}"
        dirs = ",".join(os.path.join(parent, tag, d) for d in ("d0", "d1"))
        cfg = config("", mla=mla, extra={
            "storage_dir": dirs, "naming": "sglang", "page_format": "raw",
            "use_direct_io": direct,
        })
        # Pages of 12 KiB (MHA halves, MLA pages) and flat pages of 24/12 KiB: sizes SGLang's
        # NIXL writes under O_DIRECT too (it fails on lengths off the filesystem's alignment).
        pool = HostPool(
            "page_first" if layout == "anchor" else layout, mla=mla, heads=4, head_dim=128,
            kv_cache_dim=512, base_at=(4096, 0 if aligned else 64),
        )
        if layout == "anchor":
            pool.kv_buffer = None
        # The caller closes it after each case: a POSIX backend holds a descriptor per
        # bucket dir, 256 per storage dir.
        backend = HiCacheBackend(cfg, {})
        try:
            backend.register_mem_pool_host(pool)
        except BaseException:
            backend.close()
            raise
        files = NixlFileManager(self.parse_dirs(dirs), use_direct_io=direct)
        return pool, backend, self.Naming(cfg), files, tag

    def test_sglang_reads_what_hicache_wrote(self):
        for case in self.cases():
            with self.subTest(case=case):
                pool, backend, naming, files, tag = self.open_both(*case)
                try:
                    keys = [hashlib.sha256(f"{tag}-{p}".encode()).hexdigest() for p in range(3)]
                    if pool.kv_buffer is not None:
                        for p in range(3):
                            fill_page(pool, p, seed=p + 11)
                    self.assertEqual(backend.batch_set_v1(keys, tokens(range(3))), [True] * 3)
                    for name, want in self.sglang_objects(naming, pool, keys, range(3), case[1]):
                        path = files.get_file_path(name)
                        self.assertTrue(os.path.exists(path), f"SGLang looks for {path}")
                        self.assertEqual(read_file(path)[: len(want)], want, path)
                finally:
                    backend.close()

    def test_hicache_reads_what_sglang_wrote(self):
        for case in self.cases():
            with self.subTest(case=case):
                pool, backend, naming, files, tag = self.open_both(*case)
                try:
                    keys = [hashlib.sha256(f"s-{tag}-{p}".encode()).hexdigest() for p in range(3)]
                    if pool.kv_buffer is not None:
                        for p in range(3):
                            fill_page(pool, p, seed=p + 21)
                        written = [page_bytes(pool, p) for p in range(3)]
                    for name, data in self.sglang_objects(naming, pool, keys, range(3), case[1]):
                        write_file(files.get_file_path(name), data)
                    self.assertEqual(backend.batch_exists(keys), 3)
                    got = backend.batch_get_v1(keys + ["absent"], tokens(range(6, 10)))
                    self.assertEqual(got, [True] * 3 + [False])
                    if pool.kv_buffer is not None:
                        for p in range(3):
                            self.assertEqual(page_bytes(pool, 6 + p), written[p], f"page {p}")
                finally:
                    backend.close()

    def test_sidecars_cross_both_ways(self):
        """Hybrid pools on disk: objects hicache writes are where SGLang's
        ``_get_hybrid_component_keys`` and routing look, holding exactly the bytes of the
        pointers its zero-copy transfers move, and hicache reads the objects SGLang writes so.
        Every pool here moves zero-copy on both sides (aligned buffers); the 1000-byte
        indexer only with buffered I/O, since SGLang's O_DIRECT cannot write its pages."""
        parent = self.parents[0]
        for direct in (False, True):
            with self.subTest(direct=direct):
                kinds = ("mamba", "swa") + (() if direct else ("indexer",))
                dirs = ",".join(os.path.join(parent, f"hybrid-{int(direct)}", d) for d in ("d0", "d1"))
                cfg = config("", extra={
                    "storage_dir": dirs, "naming": "sglang", "page_format": "raw",
                    "use_direct_io": direct,
                })
                pool = HostPool("page_first", heads=4, head_dim=128, base_at=(4096, 0))
                backend = HiCacheBackend(cfg, {})
                try:
                    backend.register_mem_pool_host(pool)
                    sides = {k: SidecarHostPool(k) for k in kinds}
                    for k, side in sides.items():
                        backend.register_mem_host_pool_v2(side, PoolName(k))
                    naming = self.Naming(cfg)
                    files = NixlFileManager(self.parse_dirs(dirs), use_direct_io=direct)
                    mine = [hashlib.sha256(f"h-{direct}-{p}".encode()).hexdigest() for p in range(3)]
                    theirs = [hashlib.sha256(f"s-{direct}-{p}".encode()).hexdigest() for p in range(3)]
                    for p in range(6):
                        fill_page(pool, p, seed=p)
                    self.assertEqual(backend.batch_set_v1(mine + theirs, tokens(range(6))), [True] * 6)
                    for j, (k, side) in enumerate(sides.items()):
                        for p in range(6):
                            side.fill(p, seed=10 * j + p)
                        # hicache writes pages 0..2: SGLang's names, paths and bytes.
                        put = PoolTransfer(name=PoolName(k), host_indices=tokens(range(3)), keys=mine)
                        self.assertEqual(backend.batch_set_v2([put]), {k: [True] * 3})
                        ptrs, sizes = side.get_page_buffer_meta(tokens(range(3)))
                        names = naming._get_hybrid_component_keys(mine, PoolName(k), len(ptrs) // 3)
                        for name, ptr, size in zip(names, ptrs, sizes):
                            path = files.get_file_path(name)
                            self.assertTrue(os.path.exists(path), f"SGLang looks for {path}")
                            self.assertEqual(read_file(path), ctypes.string_at(ptr, size), path)
                        # SGLang writes pages 3..5: hicache finds and reads them.
                        ptrs, sizes = side.get_page_buffer_meta(tokens(range(3, 6)))
                        names = naming._get_hybrid_component_keys(theirs, PoolName(k), len(ptrs) // 3)
                        for name, ptr, size in zip(names, ptrs, sizes):
                            write_file(files.get_file_path(name), ctypes.string_at(ptr, size))
                        want = [side.page_bytes(p) for p in range(3, 6)]
                        found = backend.batch_exists_v2(theirs, [PoolTransfer(name=PoolName(k))])
                        self.assertEqual(found.restorable_prefix_pages, [1, 2, 3], k)
                        get = PoolTransfer(name=PoolName(k), host_indices=tokens(range(6, 9)), keys=theirs)
                        self.assertEqual(backend.batch_get_v2([get]), {k: [True] * 3})
                        self.assertEqual([side.page_bytes(p) for p in range(6, 9)], want, k)
                    # A pool without pointers: both sides store SGLang's flat page under
                    # the pool's one component name.
                    flat = SidecarHostPool("indexer" if not direct else "swa", pointers=False)
                    name = PoolName.DEEPSEEK_V4_C4
                    backend.register_mem_host_pool_v2(flat, name)
                    for p in range(6):
                        flat.fill(p, seed=70 + p)
                    put = PoolTransfer(name=name, host_indices=tokens(range(3)), keys=mine)
                    self.assertEqual(backend.batch_set_v2([put]), {str(name.value): [True] * 3})
                    for key, page in zip(naming._get_component_keys(mine, name), range(3)):
                        path = files.get_file_path(key)
                        self.assertEqual(read_file(path), flat.get_data_page(page * PAGE).tobytes(), path)
                    for key, page in zip(naming._get_component_keys(theirs, name), range(3, 6)):
                        write_file(files.get_file_path(key), flat.get_data_page(page * PAGE).tobytes())
                    want = [flat.page_bytes(p) for p in range(3, 6)]
                    get = PoolTransfer(name=name, host_indices=tokens(range(6, 9)), keys=theirs)
                    self.assertEqual(backend.batch_get_v2([get]), {str(name.value): [True] * 3})
                    self.assertEqual([flat.page_bytes(p) for p in range(6, 9)], want)
                finally:
                    backend.close()

    def test_pages_off_the_direct_io_alignment(self):
        """A 576-byte MLA page: SGLang can store it only with buffered I/O (its O_DIRECT
        write fails on that length), as an object of exactly 576 bytes. hicache reads it
        with buffered I/O; under direct I/O it stores such pages padded to the alignment
        (SGLang reads their first 576 bytes) and takes SGLang's exact-size ones for a size
        mismatch: a miss, never wrong bytes."""
        parent = self.parents[0]
        for direct in (False, True):
            with self.subTest(direct=direct):
                dirs = os.path.join(parent, f"odd-{int(direct)}")
                cfg = config("", mla=True, extra={
                    "storage_dir": dirs, "naming": "sglang", "page_format": "raw",
                    "use_direct_io": direct,
                })
                # layer_first: SGLang copies it whatever the I/O, so both name it alike.
                pool = HostPool("layer_first", mla=True)
                backend = HiCacheBackend(cfg, {})
                self.addCleanup(backend.close)
                backend.register_mem_pool_host(pool)
                files = NixlFileManager(self.parse_dirs(dirs), use_direct_io=False)
                naming = self.Naming(cfg)
                fill_page(pool, 0, seed=5)
                want = page_bytes(pool, 0)
                key = hashlib.sha256(f"odd-{direct}".encode()).hexdigest()
                buffered = HostPool("layer_first", mla=True)
                buffered.kv_buffer[:] = pool.kv_buffer
                objects = self.sglang_objects(naming, buffered, [key], [0], direct=False)
                for name, data in objects:
                    self.assertEqual(len(data), 576)
                    write_file(files.get_file_path(name), data)
                got = backend.batch_get_v1([key], tokens([5]))
                self.assertEqual(got, [not direct])
                if direct:
                    self.assertEqual(backend.stats()["pages_invalid"], 1, "a size mismatch")
                    self.assertNotEqual(page_bytes(pool, 5), want)
                else:
                    self.assertEqual(page_bytes(pool, 5), want)
                mine = hashlib.sha256(f"odd-hicache-{direct}".encode()).hexdigest()
                self.assertEqual(backend.batch_set_v1([mine], tokens([0])), [True])
                stored = read_file(files.get_file_path(naming._get_suffixed_key(mine)))
                self.assertEqual(stored[:576], want)
                self.assertEqual(len(stored) > 576, direct, "padded under direct I/O only")

    def test_names_up_to_name_max(self):
        """SGLang's names run to NAME_MAX (255 bytes): a long model name fills a `_k`/`_v`
        name to exactly 255, which both sides store; a byte more is refused for that page."""
        key = "e" * 64
        for extra, ok in ((0, True), (1, False)):
            with self.subTest(extra=extra):
                dirs = os.path.join(self.parents[0], f"long-{extra}")
                # key + "_" + model + "_0_1" + "_k" = 255 bytes
                model = "m" * (255 - len(key) - len("_") - len("_0_1") - len("_k") + extra)
                cfg = config("", extra={"storage_dir": dirs, "naming": "sglang",
                                        "page_format": "raw", "use_direct_io": False})
                cfg.model_name = model
                pool = HostPool("page_first")
                backend = HiCacheBackend(cfg, {})
                self.addCleanup(backend.close)
                backend.register_mem_pool_host(pool)
                fill_page(pool, 0, seed=1)
                self.assertEqual(backend.batch_set_v1([key], tokens([0])), [ok])
                if ok:
                    naming = self.Naming(cfg)
                    files = NixlFileManager(self.parse_dirs(dirs), use_direct_io=False)
                    for name in naming._get_key_list_from_meta([key]):
                        self.assertEqual(len(name), 255)
                        self.assertTrue(os.path.exists(files.get_file_path(name)), name)
                    self.assertEqual(backend.batch_get_v1([key], tokens([3])), [True])
                    self.assertEqual(page_bytes(pool, 3), page_bytes(pool, 0))


class Refusals(unittest.TestCase):
    """Hostile and unsupported input: a clear error, nothing stored, no crash."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        # A cleanup, not tearDown: it must run after the backends' own cleanups close them.
        self.addCleanup(self.dir.cleanup)
        self.root = self.dir.name

    def test_config_errors_name_the_key(self):
        with self.assertRaisesRegex(hicache.HiCacheError, "storage_dri"):
            HiCacheBackend(config(self.root, extra={"storage_dri": "/x"}), {})
        with self.assertRaisesRegex(hicache.HiCacheError, "interface_v1"):
            HiCacheBackend(config(self.root, extra={"interface_v1": "maybe"}), {})

    def test_extra_config_in_every_form(self):
        """A dict, JSON text or ``@path`` work alike; a value JSON cannot hold, and an
        extra config of another type, are errors naming the key or the type."""
        pool = HostPool("page_first")
        path = os.path.join(self.root, "hicache.json")
        with open(path, "w") as f:
            json.dump({"storage_dir": self.root}, f)
        forms = {"dict": {"storage_dir": self.root}, "text": json.dumps({"storage_dir": self.root}),
                 "file": "@" + path}
        for name, extra in forms.items():
            with self.subTest(form=name):
                cfg = config(self.root)
                cfg.extra_config = extra
                backend = HiCacheBackend(cfg, {})
                self.addCleanup(backend.close)
                backend.register_mem_pool_host(pool)
                self.assertEqual(backend.batch_set_v1([f"form-{name}"], tokens([0])), [True])
        bad = {
            "storage_dir": (pathlib.Path(self.root), "storage_dir.*PosixPath"),
            "use_direct_io": (float("nan"), "use_direct_io.*float"),
            "plugin": (object(), "plugin.*object"),
        }
        for key, (value, message) in bad.items():
            with self.subTest(key=key):
                with self.assertRaisesRegex(hicache.HiCacheError, message):
                    HiCacheBackend(config(self.root, extra={key: value}), {})
        cfg = config(self.root)
        cfg.extra_config = [("storage_dir", self.root)]
        with self.assertRaisesRegex(hicache.HiCacheError, "extra_config is a list"):
            HiCacheBackend(cfg, {})

    def test_environment_values_that_are_not_utf8(self):
        """A value that is not UTF-8 in a variable hicache does not read is ignored; in one
        it reads, it is an error naming the variable, never a panic."""
        text = json.dumps({"storage_dir": self.root})
        for name in (b"SOME_OTHER_TOOL", b"HICACHE_NAMING"):
            self.addCleanup(os.environb.pop, name, None)
        os.environb[b"SOME_OTHER_TOOL"] = b"/tmp/\xff\xfe"
        hicache.Connector(text).close()
        os.environb[b"HICACHE_NAMING"] = b"\xff"
        with self.assertRaisesRegex(hicache.HiCacheError, "HICACHE_NAMING.*UTF-8"):
            hicache.Connector(text)

    def test_bad_identities_and_config_text(self):
        with self.assertRaisesRegex(hicache.HiCacheError, "tp_rank"):
            HiCacheBackend(config(self.root, tp_rank=2, tp_size=2), {})
        with self.assertRaisesRegex(hicache.HiCacheError, "JSON"):
            hicache.Connector("{not json")
        with self.assertRaises(OverflowError):
            hicache.Connector("{}", tp_rank=-1)
        connector = hicache.Connector(json.dumps({"storage_dir": self.root}))
        with self.assertRaisesRegex(hicache.HiCacheError, "pool"):
            connector.batch_set(["a"], [0, 1, 2, 3])
        with self.assertRaisesRegex(hicache.HiCacheError, "attention"):
            connector.register_pool(None, attention="gqa", layers=1, page_tokens=4,
                                    dtype="f16", layout="page_first", pages=1)
        with self.assertRaisesRegex(hicache.HiCacheError, "kv_cache_dim"):
            connector.register_pool(None, attention="mla", layers=1, page_tokens=4,
                                    dtype="f16", layout="page_first", pages=1, kv_heads=2)
        with self.assertRaisesRegex(hicache.HiCacheError, "dtype|float128"):
            connector.register_pool(None, attention="mla", layers=1, page_tokens=4,
                                    dtype="float128", layout="page_first", pages=1, kv_cache_dim=8)
        connector.close()

    def test_unsupported_layouts_and_dcp(self):
        backend = HiCacheBackend(config(self.root), {})
        self.addCleanup(backend.close)
        pool = HostPool("page_first")
        pool.layout = "page_unified"
        with self.assertRaisesRegex(ValueError, "page_unified"):
            backend.register_mem_pool_host(pool)
        cfg = config(self.root)
        cfg.dcp_size, cfg.dcp_rank = 2, 0
        with self.assertRaisesRegex(ValueError, "dcp_size"):
            HiCacheBackend(cfg, {})

    def test_pool_pointers_that_disagree_with_the_geometry(self):
        backend = HiCacheBackend(config(self.root), {})
        self.addCleanup(backend.close)
        pool = HostPool("page_first")
        meta = pool.get_page_buffer_meta
        pool.get_page_buffer_meta = lambda idx: ([p + 2 for p in meta(idx)[0]], meta(idx)[1])
        with self.assertRaisesRegex(ValueError, "not what hicache was told"):
            backend.register_mem_pool_host(pool)

    def test_bad_buffers(self):
        backend = HiCacheBackend(config(self.root), {})
        self.addCleanup(backend.close)
        small = HostPool("page_first")
        small.kv_buffer = np.zeros(small.kv_buffer.size // 2, np.float16)
        with self.assertRaisesRegex(hicache.HiCacheError, "bytes"):
            backend.register_mem_pool_host(small)
        frozen = HostPool("page_first")
        frozen.kv_buffer.setflags(write=False)
        with self.assertRaisesRegex(hicache.HiCacheError, "read-only"):
            backend.register_mem_pool_host(frozen)
        strided = HostPool("page_first")
        strided.kv_buffer = np.zeros((2, 2 * strided.size, LAYERS, 2, 16), np.float16)[:, ::2]
        with self.assertRaisesRegex(hicache.HiCacheError, "contiguous"):
            backend.register_mem_pool_host(strided)
        with self.assertRaisesRegex(hicache.HiCacheError, "torch tensor"):
            backend._connector.register_pool(
                object(), attention="mha", layers=1, page_tokens=4, dtype="f16",
                layout="page_first", pages=1, kv_heads=1, head_dim=8,
            )

    def test_token_slots_in_every_form(self):
        """Host indices as an int64 array (read in one copy), a list, another dtype, a strided
        view or a big-endian array (each taken as a sequence): the same pages either way; a
        negative index is refused."""
        pool = HostPool("page_first")
        backend = HiCacheBackend(config(self.root), {})
        self.addCleanup(backend.close)
        backend.register_mem_pool_host(pool)
        fill_page(pool, 0, seed=3)
        native = backend._connector
        want = tokens([0])
        forms = [
            want,
            want.tolist(),
            want.astype(np.int32),
            np.repeat(want, 2)[::2],
            want.astype(">i8"),
        ]
        for i, form in enumerate(forms):
            done, errors = native.batch_set([f"form{i}"], form)
            self.assertEqual((done, errors), ([True], []), i)
        for bad in (np.array([-4, 0, 1, 2], dtype=np.int64), [-4, 0, 1, 2]):
            with self.assertRaises((hicache.HiCacheError, OverflowError)):
                native.batch_set(["neg"], bad)
        self.assertEqual(native.batch_set([], np.array([], dtype=np.int64)), ([], []))

    def test_bad_calls(self):
        pool = HostPool("page_first")
        backend = HiCacheBackend(config(self.root), {})
        self.addCleanup(backend.close)
        backend.register_mem_pool_host(pool)
        with self.assertRaisesRegex(hicache.HiCacheError, "contiguous"):
            backend.batch_set_v1(["a"], np.array([1, 2, 3, 4]))
        with self.assertRaisesRegex(hicache.HiCacheError, "outside the pool"):
            backend.batch_set_v1(["a"], tokens([PAGES]))
        with self.assertRaisesRegex(hicache.HiCacheError, "host token indices"):
            backend.batch_set_v1(["a", "b"], tokens([0])[:6])
        self.assertEqual(backend.batch_set_v1(["bad/key", "good"], tokens([0, 1])), [False, True])
        self.assertEqual(backend.batch_exists(["bad/key", "good"]), 0)
        self.assertEqual(backend.batch_exists(["good", "bad/key"]), 1)
        self.assertEqual(os.listdir(self.root) and True, True)

    def test_closed_backend_refuses(self):
        pool = HostPool("page_first")
        backend = HiCacheBackend(config(self.root), {})
        backend.register_mem_pool_host(pool)
        backend.batch_set_v1(["a"], tokens([0]))
        backend.close()
        backend.close()  # idempotent
        calls = {
            "batch_set_v1": lambda: backend.batch_set_v1(["a"], tokens([0])),
            "batch_get_v1": lambda: backend.batch_get_v1(["a"], tokens([0])),
            "batch_exists": lambda: backend.batch_exists(["a"]),
            # A closed connector takes no new pool either.
            "register_mem_pool_host": lambda: backend.register_mem_pool_host(pool),
        }
        for name, call in calls.items():
            with self.subTest(call=name):
                with self.assertRaisesRegex(hicache.HiCacheError, "connector is closed"):
                    call()
        # Counters stay readable, and the page written before the close is still there.
        self.assertEqual(backend.stats()["pages_written"], 1)
        again = HiCacheBackend(config(self.root), {})
        again.register_mem_pool_host(HostPool("page_first"))
        self.addCleanup(again.close)
        self.assertEqual(again.batch_exists(["a"]), 1)


def aligned_zeros(shape, dtype, align=4096):
    """A zeroed numpy array whose data starts on an `align`-byte boundary."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(n + align, dtype=np.uint8)
    at = -raw.__array_interface__["data"][0] % align
    return raw[at : at + n].view(dtype).reshape(shape)


def address(array):
    if hasattr(array, "data_ptr"):
        return array.data_ptr()
    return array.__array_interface__["data"][0]


class SidecarHostPool:
    """A hybrid pool as SGLang's v2 interface sees one (``get_hybrid_pool_buffer`` and
    ``get_page_buffer_meta``), over numpy: ``mamba`` has a temporal state and two conv states
    in separate buffers (three pointers per page), ``swa`` K and V halves of one buffer (two
    pointers), ``indexer`` 1000-byte pages (one pointer, off every direct-I/O alignment)."""

    def __init__(self, kind, pages=PAGES, pointers=True):
        self.kind = kind
        self.pointers = pointers
        self.page_size = PAGE
        self.pages = pages
        if kind == "mamba":
            self.buffers = [
                aligned_zeros((pages, 1024), np.float32),
                aligned_zeros((pages, 2048), np.float16),
                aligned_zeros((pages, 2048), np.float16),
            ]
        elif kind == "swa":
            self.buffers = [aligned_zeros((2, pages, 2048), np.float16)]
        elif kind == "indexer":
            self.buffers = [aligned_zeros((pages, 1000), np.uint8)]
        else:
            raise ValueError(kind)

    def get_hybrid_pool_buffer(self):
        return self.buffers

    def _raw(self, i):
        """Buffer `i`'s bytes as a writable uint8 numpy view."""
        return self.buffers[i].reshape(-1).view(np.uint8)

    def _ranges(self, page):
        """(buffer, byte offset, length) of each pointer of `page`, in SGLang's order."""
        out = []
        for i, b in enumerate(self.buffers):
            if b.ndim == 3:  # K then V
                row = b.shape[2] * b.itemsize
                out += [(i, page * row, row), (i, (self.pages + page) * row, row)]
            else:
                row = b.shape[1] * b.itemsize
                out.append((i, page * row, row))
        return out

    def get_page_buffer_meta(self, indices):
        if not self.pointers:  # as SGLang's Mamba pool in a layer_first layout
            raise ValueError("Mamba storage zero-copy requires page_first layout, got layer_first")
        idx = indices.tolist()
        ptrs, sizes = [], []
        for t in range(0, len(idx), PAGE):
            for i, off, n in self._ranges(idx[t] // PAGE):
                ptrs.append(address(self.buffers[i]) + off)
                sizes.append(n)
        return ptrs, sizes

    def get_data_page(self, index, flat=True):
        """SGLang's flat page: the uint8 concatenation of the page's components."""
        return np.frombuffer(self.page_bytes(index // PAGE), dtype=np.uint8).copy()

    def get_dummy_flat_data_page(self):
        return np.zeros(len(self.page_bytes(0)), dtype=np.uint8)

    def set_from_flat_data_page(self, index, data):
        flat, at = data.reshape(-1).view(np.uint8), 0
        for i, off, n in self._ranges(index // PAGE):
            self._raw(i)[off : off + n] = flat[at : at + n]
            at += n

    def fill(self, page, seed):
        for i, off, n in self._ranges(page):
            raw = self._raw(i)
            raw[off : off + n] = (np.arange(n, dtype=np.uint32) * 13 + seed + off).astype(np.uint8)

    def page_bytes(self, page):
        return b"".join(self._raw(i)[off : off + n].tobytes() for i, off, n in self._ranges(page))


class TorchSidecarHostPool(SidecarHostPool):
    """The same sidecar over torch tensors (pinned where CUDA is present), whose flat pages
    are torch tensors, as SGLang's hybrid host pools hand them out."""

    def __init__(self, kind, pages=PAGES, pointers=True):
        super().__init__(kind, pages=pages, pointers=pointers)
        pin = torch.cuda.is_available()
        dtypes = {np.float32: torch.float32, np.float16: torch.bfloat16, np.uint8: torch.uint8}
        self.buffers = [
            torch.zeros(b.shape, dtype=dtypes[b.dtype.type], pin_memory=pin) for b in self.buffers
        ]

    def _raw(self, i):
        return self.buffers[i].view(-1).view(torch.uint8).numpy()

    def get_data_page(self, index, flat=True):
        return torch.from_numpy(super().get_data_page(index, flat)).view(torch.bfloat16)

    def get_dummy_flat_data_page(self):
        return torch.zeros(len(self.page_bytes(0)) // 2, dtype=torch.bfloat16)

    def set_from_flat_data_page(self, index, data):
        assert data.dtype == torch.bfloat16, data.dtype
        super().set_from_flat_data_page(index, data.reshape(-1).view(torch.uint8).numpy())


class Hybrid(unittest.TestCase):
    """The v2 interface with SGLang's own ``PoolTransfer``, ``PoolHitPolicy`` and
    ``PoolTransferResult``."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        # A cleanup, not tearDown: it must run after the backends' own cleanups close them.
        self.addCleanup(self.dir.cleanup)
        self.root = self.dir.name

    def open(self, kinds=("mamba", "swa", "indexer"), mla=False, **kw):
        pool = HostPool("page_first", mla=mla)
        backend = HiCacheBackend(config(self.root, mla=mla, **kw), {})
        self.addCleanup(backend.close)
        backend.register_mem_pool_host(pool)
        backend.register_mem_host_pool_v2(pool, PoolName.KV)  # the anchor: not registered twice
        sides = {}
        for kind in kinds:
            sides[kind] = SidecarHostPool(kind)
            backend.register_mem_host_pool_v2(sides[kind], PoolName(kind))
        backend.on_host_pools_registered()
        return backend, pool, sides

    def test_round_trip_and_exists_under_both_namings(self):
        for naming in ("hicache", "sglang"):
            with self.subTest(naming=naming):
                root = os.path.join(self.root, naming)
                backend, pool, sides = self.open(extra={"storage_dir": root, "naming": naming})
                keys = [f"{naming}{p:060x}" for p in range(4)]
                for p in range(4):
                    fill_page(pool, p, seed=p)
                    for j, side in enumerate(sides.values()):
                        side.fill(p, seed=40 * j + p)
                want = {k: [s.page_bytes(p) for p in range(4)] for k, s in sides.items()}
                self.assertEqual(backend.batch_set_v1(keys, tokens(range(4))), [True] * 4)
                put = [PoolTransfer(name=PoolName(k), host_indices=tokens(range(4)), keys=keys) for k in sides]
                self.assertEqual(backend.batch_set_v2(put), {k: [True] * 4 for k in sides})
                result = backend.batch_exists_v2(
                    keys + ["f" * 64],
                    [
                        PoolTransfer(name=PoolName.MAMBA, keys=keys[-1:], hit_policy=PoolHitPolicy.TRAILING_PAGES),
                        PoolTransfer(name=PoolName.SWA, hit_policy=PoolHitPolicy.ALL_PAGES),
                        PoolTransfer(name=PoolName.INDEXER, hit_policy=PoolHitPolicy.ALL_PAGES),
                    ],
                )
                self.assertIsInstance(result, PoolTransferResult)
                self.assertEqual(result.kv_hit_pages, 4)
                self.assertEqual(result.restorable_prefix_pages, [1, 2, 3, 4])
                self.assertEqual(
                    result.extra_pool_hit_pages,
                    {"kv": 4, "mamba": 4, "swa": 4, "indexer": 4},
                )
                get = [PoolTransfer(name=PoolName(k), host_indices=tokens(range(6, 10)), keys=keys) for k in sides]
                self.assertEqual(backend.batch_get_v2(get), {k: [True] * 4 for k in sides})
                for k, side in sides.items():
                    self.assertEqual([side.page_bytes(p) for p in range(6, 10)], want[k], k)
                if naming == "sglang":
                    names = {f for _, _, files in os.walk(root) for f in files}
                    suffix = "_org-model-7b_0_1"
                    for tag in ("_mamba_temporal", "_mamba_conv_0", "_mamba_conv_1", "_swa_k", "_swa_v", "_indexer"):
                        self.assertIn(f"{keys[0]}{suffix}{tag}", names, tag)

    def test_trailing_pages_never_claim_an_unrestorable_prefix(self):
        backend, pool, sides = self.open(kinds=("mamba", "swa"))
        keys = [f"t{p:063x}" for p in range(6)]
        for p in range(6):
            fill_page(pool, p, seed=p)
            sides["mamba"].fill(p, seed=p + 1)
            sides["swa"].fill(p, seed=p + 2)
        self.assertEqual(backend.batch_set_v1(keys, tokens(range(6))), [True] * 6)
        at = [1, 3, 4]
        mamba_put = PoolTransfer(name=PoolName.MAMBA, host_indices=tokens(at), keys=[keys[p] for p in at])
        swa_put = PoolTransfer(name=PoolName.SWA, host_indices=tokens(range(4)), keys=keys[:4])
        self.assertEqual(backend.batch_set_v2([mamba_put, swa_put]), {"mamba": [True] * 3, "swa": [True] * 4})
        trailing = PoolTransfer(name=PoolName.MAMBA, keys=keys[-1:], hit_policy=PoolHitPolicy.TRAILING_PAGES)
        alone = backend.batch_exists_v2(keys, [trailing])
        self.assertEqual((alone.kv_hit_pages, alone.restorable_prefix_pages), (5, [2, 4, 5]))
        both = backend.batch_exists_v2(keys, [trailing, PoolTransfer(name=PoolName.SWA)])
        # SGLang's min-fold would claim 4 pages with SWA's 4 and Mamba's best 5; here 4 is
        # claimed because a read of it restores: Mamba's page 3 and SWA's pages 0..3.
        self.assertEqual((both.kv_hit_pages, both.restorable_prefix_pages), (4, [2, 4]))
        self.assertEqual(both.extra_pool_hit_pages, {"kv": 6, "mamba": 5, "swa": 4})
        for length in range(1, 7):
            got = backend.batch_get_v2(
                [
                    PoolTransfer(name=PoolName.MAMBA, host_indices=tokens([8]), keys=[keys[length - 1]]),
                    PoolTransfer(name=PoolName.SWA, host_indices=tokens(range(6, 6 + length)), keys=keys[:length]),
                ]
            )
            restored = all(all(v) for v in got.values())
            self.assertEqual(restored, length in both.restorable_prefix_pages, length)

    def test_three_threads_move_sidecars_at_once(self):
        backend, pool, sides = self.open(kinds=("mamba", "indexer"))
        failures = []

        def worker(t):
            try:
                src, dst = [t * 2, t * 2 + 1], [6 + t * 2, 7 + t * 2]
                keys = [f"th{t}x{i:061x}" for i in range(2)]
                for round_ in range(15):
                    for p in src:
                        fill_page(pool, p, seed=round_ + p)
                        for side in sides.values():
                            side.fill(p, seed=round_ * 3 + p)
                    want = {k: [s.page_bytes(p) for p in src] for k, s in sides.items()}
                    assert backend.batch_set_v1(keys, tokens(src)) == [True, True]
                    put = [PoolTransfer(name=PoolName(k), host_indices=tokens(src), keys=keys) for k in sides]
                    assert backend.batch_set_v2(put) == {k: [True, True] for k in sides}
                    queries = [PoolTransfer(name=PoolName(k)) for k in sides]
                    assert backend.batch_exists_v2(keys, queries).kv_hit_pages == 2
                    get = [PoolTransfer(name=PoolName(k), host_indices=tokens(dst), keys=keys) for k in sides]
                    assert backend.batch_get_v2(get) == {k: [True, True] for k in sides}
                    got = {k: [s.page_bytes(p) for p in dst] for k, s in sides.items()}
                    assert got == want, f"thread {t} round {round_}"
            except Exception as e:  # reported below
                failures.append(repr(e))

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(3)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        self.assertEqual(failures, [])

    def test_replicated_sidecars_are_written_by_rank_zero_only(self):
        rank1, _, sides = self.open(kinds=("mamba", "indexer"), mla=True, tp_rank=1, tp_size=2)
        keys = [f"r{p:063x}" for p in range(2)]
        for side in sides.values():
            side.fill(0, seed=3)
            side.fill(1, seed=4)
        put = [PoolTransfer(name=PoolName(k), host_indices=tokens([0, 1]), keys=keys) for k in sides]
        self.assertEqual(rank1.batch_set_v2(put), {"mamba": [True, True], "indexer": [True, True]})
        get = [PoolTransfer(name=PoolName(k), host_indices=tokens([2, 3]), keys=keys) for k in sides]
        # Mamba state is TP-sharded: this rank wrote its own. The indexer is rank 0's to write.
        self.assertEqual(rank1.batch_get_v2(get), {"mamba": [True, True], "indexer": [False, False]})

    def test_logical_anchor_kv_pool_with_sidecars(self):
        """DeepSeek-V4's form: the KV pool has no bytes (``kv_buffer is None``, marker
        objects) and the sidecars hold the state."""
        pool = HostPool("page_first")
        pool.kv_buffer = None
        backend = HiCacheBackend(config(self.root), {})
        self.addCleanup(backend.close)
        backend.register_mem_pool_host(pool)
        side = SidecarHostPool("swa")
        backend.register_mem_host_pool_v2(side, PoolName.DEEPSEEK_V4_C4)
        keys = [f"a{p:063x}" for p in range(3)]
        for p in range(3):
            side.fill(p, seed=p)
        want = [side.page_bytes(p) for p in range(3)]
        self.assertEqual(backend.batch_set_v1(keys, tokens(range(3))), [True] * 3)
        put = PoolTransfer(name=PoolName.DEEPSEEK_V4_C4, host_indices=tokens(range(3)), keys=keys)
        self.assertEqual(backend.batch_set_v2([put]), {"deepseek_v4_c4": [True] * 3})
        found = backend.batch_exists_v2(keys, [PoolTransfer(name=PoolName.DEEPSEEK_V4_C4)])
        self.assertEqual((found.kv_hit_pages, found.restorable_prefix_pages), (3, [1, 2, 3]))
        get = [
            PoolTransfer(name=PoolName.KV, host_indices=tokens(range(6, 9)), keys=keys),
            PoolTransfer(name=PoolName.DEEPSEEK_V4_C4, host_indices=tokens(range(6, 9)), keys=keys),
        ]
        self.assertEqual(backend.batch_get_v2(get), {"kv": [True] * 3, "deepseek_v4_c4": [True] * 3})
        self.assertEqual([side.page_bytes(p) for p in range(6, 9)], want)

    def test_pools_without_pointers_are_copied_through_staging(self):
        """A sidecar whose pointers are unavailable (SGLang's Mamba pool outside page_first)
        moves through staging slots with its own flat pages: calls of more pages than the
        slots are chunked, and a read after a KV miss restores nothing past it."""
        backend, pool, _ = self.open(kinds=())
        big = SidecarHostPool("mamba", pages=300, pointers=False)
        backend.register_mem_host_pool_v2(big, PoolName.MAMBA)
        keys = [f"c{p:063x}" for p in range(300)]
        for p in range(300):
            big.fill(p, seed=p)
        want = [big.page_bytes(p) for p in range(300)]
        put = PoolTransfer(name=PoolName.MAMBA, host_indices=tokens(range(300)), keys=keys)
        self.assertEqual(backend.batch_set_v2([put]), {"mamba": [True] * 300})
        for p in range(300):
            big.fill(p, seed=1000 + p)
        self.assertEqual(backend.batch_get_v2([put]), {"mamba": [True] * 300})
        self.assertEqual([big.page_bytes(p) for p in range(300)], want)
        found = backend.batch_exists_v2(keys[:3], [PoolTransfer(name=PoolName.MAMBA)])
        self.assertEqual(found.restorable_prefix_pages, [], "no KV pages were written")
        fill_page(pool, 0, seed=1)
        self.assertEqual(backend.batch_set_v1(keys[:1] + keys[2:3], tokens([0, 2])), [True, True])
        got = backend.batch_get_v2(
            [
                PoolTransfer(name=PoolName.KV, host_indices=tokens(range(6, 9)), keys=keys[:3]),
                PoolTransfer(name=PoolName.MAMBA, host_indices=tokens(range(3)), keys=keys[:3]),
            ]
        )
        self.assertEqual(got, {"kv": [True, False, True], "mamba": [True, False, False]})

    @unittest.skipUnless(REAL_TORCH, "needs torch, which is not installed here")
    def test_torch_sidecars_in_place_and_copied(self):
        backend, pool, _ = self.open(kinds=())
        sides = {
            PoolName.MAMBA: TorchSidecarHostPool("mamba"),
            PoolName.SWA: TorchSidecarHostPool("swa"),
            PoolName.DEEPSEEK_V4_C4: TorchSidecarHostPool("mamba", pointers=False),
        }
        for name, side in sides.items():
            backend.register_mem_host_pool_v2(side, name)
        keys = [f"tt{p:062x}" for p in range(4)]
        for p in range(4):
            fill_page(pool, p, seed=p)
            for j, side in enumerate(sides.values()):
                side.fill(p, seed=9 * j + p)
        want = {n: [s.page_bytes(p) for p in range(4)] for n, s in sides.items()}
        self.assertEqual(backend.batch_set_v1(keys, tokens(range(4))), [True] * 4)
        idx = torch.tensor(tokens(range(4)), dtype=torch.int64)
        put = [PoolTransfer(name=n, host_indices=idx, keys=keys) for n in sides]
        self.assertEqual(backend.batch_set_v2(put), {str(n.value): [True] * 4 for n in sides})
        found = backend.batch_exists_v2(keys, [PoolTransfer(name=n) for n in sides])
        self.assertEqual(found.restorable_prefix_pages, [1, 2, 3, 4])
        dst = torch.tensor(tokens(range(6, 10)), dtype=torch.int64)
        get = [PoolTransfer(name=n, host_indices=dst, keys=keys) for n in sides]
        self.assertEqual(backend.batch_get_v2(get), {str(n.value): [True] * 4 for n in sides})
        for n, side in sides.items():
            self.assertEqual([side.page_bytes(p) for p in range(6, 10)], want[n], n)

    def test_refusals(self):
        backend, _, _ = self.open(kinds=("swa",))
        with self.assertRaisesRegex(ValueError, "no page pointers .* no get_data_page"):
            backend.register_mem_host_pool_v2(object(), PoolName.DEEPSEEK_V4_C4)
        empty = types.SimpleNamespace(
            get_hybrid_pool_buffer=lambda: [], get_page_buffer_meta=lambda indices: ([], [])
        )
        with self.assertRaisesRegex(ValueError, "no buffers"):
            backend.register_mem_host_pool_v2(empty, PoolName.INDEXER)
        self.assertEqual(
            backend.batch_exists_v2(["a" * 64], [PoolTransfer(name=PoolName.MAMBA)]),
            PoolTransferResult.empty(),
        )
        native = backend._connector
        with self.assertRaisesRegex(hicache.HiCacheError, "needs 8192"):
            native.register_sidecar("swa", [np.zeros(10, np.uint8)], [(4096, [(0, 4096)])],
                                    page_tokens=1, pages=2, replicated=False, format="x")
        with self.assertRaisesRegex(hicache.HiCacheError, "1 buffers but 2"):
            native.register_sidecar("swa", [np.zeros(8192, np.uint8)] * 2, [(4096, [(0, 4096)])],
                                    page_tokens=1, pages=2, replicated=False, format="x")
        with self.assertRaisesRegex(hicache.HiCacheError, "overlap"):
            native.register_sidecar("swa", [np.zeros(8192, np.uint8)], [(4096, [(0, 4097)])],
                                    page_tokens=1, pages=2, replicated=False, format="x")
        with self.assertRaisesRegex(hicache.HiCacheError, "pool name"):
            native.register_sidecar("../x", [np.zeros(8192, np.uint8)], [(4096, [(0, 4096)])],
                                    page_tokens=1, pages=2, replicated=False, format="x")
        with self.assertRaisesRegex(hicache.HiCacheError, "hit policy"):
            native.batch_exists_v2(["a" * 64], [("swa", "sideways", 0)])
        with self.assertRaisesRegex(hicache.HiCacheError, "at least 1"):
            native.batch_exists_v2(["a" * 64], [("swa", "trailing_pages", 0)])
        with self.assertRaisesRegex(hicache.HiCacheError, "host token indices"):
            native.batch_set_v2([("swa", ["a" * 64, "b" * 64], [0, 1, 2])])
        with self.assertRaisesRegex(ValueError, "block_groups"):
            backend.batch_exists_v2(["a" * 64], [PoolTransfer(name=PoolName.SWA, hit_policy=PoolHitPolicy.BLOCK_GROUPS)])
        with self.assertRaisesRegex(hicache.HiCacheError, "mamba"):
            backend.batch_set_v2([PoolTransfer(name=PoolName.MAMBA, host_indices=tokens([0]), keys=["a" * 64])])
        with self.assertRaisesRegex(hicache.HiCacheError, "outside the pool"):
            backend.batch_set_v2([PoolTransfer(name=PoolName.SWA, host_indices=tokens([PAGES]), keys=["a" * 64])])
        self.assertEqual(
            backend.batch_set_v2([PoolTransfer(name=PoolName.SWA, host_indices=None, keys=["a" * 64])]),
            {"swa": [False]},
        )
        self.assertEqual(
            backend.batch_set_v2([PoolTransfer(name=PoolName.SWA, host_indices=tokens([0, 1]), keys=["bad/key", "b" * 64])]),
            {"swa": [False, True]},
        )


if __name__ == "__main__":
    unittest.main()
