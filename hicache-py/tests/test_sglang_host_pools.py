"""hicache with SGLang's own host-pool classes and SGLang's own NIXL backend.

``test_sglang.py`` builds host pools as numpy stand-ins, because CI has neither torch nor the
server's dependencies. This module uses the real thing: ``MHATokenToKVPoolHost`` and
``MLATokenToKVPoolHost`` from SGLang 0.5.23 (their ``kv_buffer``, ``get_page_buffer_meta``,
``get_data_page``) and, where the ``nixl`` package is installed, ``HiCacheNixl`` itself writing
and reading through NIXL's POSIX plugin.

It needs torch, SGLang's whole ``sglang/`` tree in ``HICACHE_SGLANG_SOURCE`` (its host pools
import much of the server) and that tree's own Python dependencies; NIXL for the second class.
Where any is missing, each case is skipped and says which. CI has none of them, so there every
case skips; they run on a machine with torch::

    CUDA_VISIBLE_DEVICES= HICACHE_SGLANG_SOURCE=<dir> python -m unittest test_sglang_host_pools

The pools are built on CPU: on CUDA, SGLang's host-pool modules import ``sgl_kernel`` for their
device copies, which a storage backend never calls.
"""

import ctypes
import os
import sys
import tempfile
import unittest

_SOURCE = os.environ.get("HICACHE_SGLANG_SOURCE")
if _SOURCE and _SOURCE not in sys.path:
    sys.path.insert(0, _SOURCE)


def _load():
    """SGLang's host-pool classes, or why they cannot be had here."""
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if not hasattr(torch, "zeros"):
        return None, "torch is test_sglang.py's annotation stand-in, not torch"
    if not _SOURCE:
        return None, "HICACHE_SGLANG_SOURCE is not set"
    if torch.cuda.is_available():
        return None, (
            "a GPU is visible, so SGLang's host pools need sgl_kernel; run with "
            "CUDA_VISIBLE_DEVICES= to build them on CPU"
        )
    try:
        from sglang.srt.mem_cache.device_pool_info import (
            KVBufferLayout,
            KVBuffers,
            MHABufferInfo,
            MLABufferInfo,
        )
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
        from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
    except Exception as e:  # the server's dependencies are not all installed
        return None, f"SGLang's host-pool modules cannot be imported: {e!r}"
    return dict(
        torch=torch,
        KVBufferLayout=KVBufferLayout,
        KVBuffers=KVBuffers,
        MHABufferInfo=MHABufferInfo,
        MLABufferInfo=MLABufferInfo,
        MHA=MHATokenToKVPoolHost,
        MLA=MLATokenToKVPoolHost,
    ), None


SG, WHY = _load()

MHA_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
MLA_LAYOUTS = ("layer_first", "page_first", "page_first_direct")
PAGE = 16  # tokens per page
DEVICE_TOKENS = 8 * PAGE  # the device pool; the host pool holds twice as many, plus a page
LAYERS = 3


def host_pool(layout, mla, heads=4, head_dim=128, kv_cache_dim=576, page=PAGE, layers=LAYERS,
              device_tokens=DEVICE_TOKENS, ratio=2.0):
    """One of SGLang's own host pools, sized from a CPU "device" pool as SGLang sizes it:
    ``ratio`` times the device pool's tokens, plus one page."""
    torch = SG["torch"]
    dtype, cpu = torch.bfloat16, torch.device("cpu")
    if mla:
        rows = tuple(torch.zeros(device_tokens, 1, kv_cache_dim, dtype=dtype) for _ in range(layers))
        info = SG["MLABufferInfo"](
            buffers=rows,
            data_ptrs=torch.tensor([t.data_ptr() for t in rows], dtype=torch.uint64),
            layer_indices=tuple(range(layers)),
            device_layer_num=layers,
            page_size=page,
            kv_lora_rank=kv_cache_dim - 64,
            qk_rope_head_dim=64,
            kv_cache_dim=kv_cache_dim,
            dtype=dtype,
            device=cpu,
        )
        return SG["MLA"](
            info, ratio, 0, page, layout, pin_memory=False, device="cpu",
            device_capacity_tokens=device_tokens, start_layer=0, end_layer=layers,
            target_layer_num=layers,
        )
    k = tuple(torch.zeros(device_tokens, heads, head_dim, dtype=dtype) for _ in range(layers))
    v = tuple(torch.zeros(device_tokens, heads, head_dim, dtype=dtype) for _ in range(layers))
    info = SG["MHABufferInfo"](
        buffers=SG["KVBuffers"](
            k=k,
            v=v,
            k_data_ptrs=torch.tensor([t.data_ptr() for t in k], dtype=torch.uint64),
            v_data_ptrs=torch.tensor([t.data_ptr() for t in v], dtype=torch.uint64),
            layout=SG["KVBufferLayout"].NHD,
        ),
        page_size=page,
        head_num=heads,
        head_dim=head_dim,
        v_head_dim=head_dim,
        dtype=dtype,
        device=cpu,
    )
    return SG["MHA"](
        info, ratio, 0, page, layout, pin_memory=False, device="cpu",
        device_capacity_tokens=device_tokens, start_layer=0, end_layer=layers,
    )


def fill(pool, seed):
    """Random bytes over the whole ``kv_buffer``."""
    torch = SG["torch"]
    flat = pool.kv_buffer.view(-1).view(torch.uint8)
    gen = torch.Generator().manual_seed(seed)
    flat.copy_(torch.randint(0, 256, flat.shape, dtype=torch.uint8, generator=gen))


def slots(pages, page=PAGE):
    """Host token indices of ``pages``, as SGLang passes them: an int64 CPU tensor."""
    torch = SG["torch"]
    return torch.tensor([p * page + t for p in pages for t in range(page)], dtype=torch.int64)


def by_pointers(pool, pages):
    """The bytes of ``pages`` at SGLang's own page pointers (``get_page_buffer_meta``)."""
    ptrs, sizes = pool.get_page_buffer_meta(slots(pages))
    return [ctypes.string_at(int(p), int(n)) for p, n in zip(ptrs, sizes)]


def flat_pages(pool, pages):
    """SGLang's flat copy of each page (``get_data_page``)."""
    return [pool.get_data_page(p * PAGE).view(-1).view(SG["torch"].uint8).numpy().tobytes() for p in pages]


def storage_config(mla, extra_config):
    """SGLang's own storage config for TP rank 0 of 1."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=False, is_page_first_layout=False,
        model_name="org/model-7b", extra_config=extra_config,
    )


def config(root, mla, extra=None):
    """The config of hicache's backend over ``root``, with more extra-config keys."""
    extra_config = {"interface_v1": 1, "storage_dir": root}
    extra_config.update(extra or {})
    return storage_config(mla, extra_config)


def cases():
    for mla in (False, True):
        for layout in MLA_LAYOUTS if mla else MHA_LAYOUTS:
            yield mla, layout


@unittest.skipIf(SG is None, WHY)
class OwnHostPools(unittest.TestCase):
    """hicache's backend over SGLang's own MHA and MLA host pools, in every layout."""

    def setUp(self):
        from hicache.sglang import HiCacheBackend

        self.Backend = HiCacheBackend
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def open(self, pool, mla, name, extra=None):
        backend = self.Backend(config(os.path.join(self.dir.name, name), mla, extra), {})
        self.addCleanup(backend.close)
        # Registration cross-checks hicache's geometry against the pool's own pointers.
        backend.register_mem_pool_host(pool)
        return backend

    def test_every_layout_round_trips(self):
        for mla, layout in cases():
            with self.subTest(mla=mla, layout=layout):
                pool = host_pool(layout, mla)
                backend = self.open(pool, mla, f"{layout}-{mla}")
                fill(pool, seed=len(layout) + mla)
                src, dst = [1, 2, 3, 4], [9, 10, 11, 12]
                want_ptrs, want_flat = by_pointers(pool, src), flat_pages(pool, src)
                keys = [f"{layout}-{mla}-{p:064x}" for p in src]
                self.assertEqual(backend.batch_exists(keys), 0)
                self.assertEqual(backend.batch_set_v1(keys, slots(src)), [True] * 4)
                self.assertEqual(backend.batch_exists(keys + ["absent"]), 4)
                got = backend.batch_get_v1(keys[:3] + ["absent"], slots(dst))
                self.assertEqual(got, [True, True, True, False])
                n = len(want_ptrs) // 4  # pointers per page
                self.assertEqual(by_pointers(pool, dst[:3]), want_ptrs[: 3 * n])
                self.assertEqual(flat_pages(pool, dst[:3]), want_flat[:3])

    def test_sglang_naming_round_trips(self):
        for mla, layout in cases():
            for direct in (False, True):
                with self.subTest(mla=mla, layout=layout, direct=direct):
                    pool = host_pool(layout, mla)
                    backend = self.open(
                        pool, mla, f"sg-{layout}-{mla}-{direct}",
                        {"naming": "sglang", "page_format": "raw", "use_direct_io": direct},
                    )
                    fill(pool, seed=7)
                    want = flat_pages(pool, [2, 3])
                    keys = [f"sg{p:063x}" for p in (2, 3)]
                    self.assertEqual(backend.batch_set_v1(keys, slots([2, 3])), [True, True])
                    self.assertEqual(backend.batch_get_v1(keys, slots([14, 15])), [True, True])
                    self.assertEqual(flat_pages(pool, [14, 15]), want)


def _nixl():
    if SG is None:
        return None, WHY
    try:
        import nixl._api  # noqa: F401  (HiCacheNixl imports it; the error says so plainly)
        from sglang.srt.mem_cache.storage.nixl.hicache_nixl import HiCacheNixl
    except Exception as e:
        return None, f"SGLang's NIXL backend cannot be imported: {e!r}"
    return HiCacheNixl, None


NIXL, NIXL_WHY = _nixl()


@unittest.skipIf(NIXL is None, NIXL_WHY)
class OwnNixlBackend(unittest.TestCase):
    """Pages that SGLang's own ``HiCacheNixl`` writes through NIXL's POSIX plugin are read by
    hicache with ``naming = "sglang"``, and the other way round, over SGLang's own host pools.
    O_DIRECT on and off; zero-copy and copy layouts of SGLang's backend."""

    def setUp(self):
        from hicache.sglang import HiCacheBackend

        self.Backend = HiCacheBackend
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        os.environ["SGLANG_HICACHE_NIXL_BACKEND_PLUGIN"] = "POSIX"
        self.addCleanup(os.environ.pop, "SGLANG_HICACHE_NIXL_BACKEND_PLUGIN", None)

    def test_pages_cross_both_ways(self):
        for mla, layout in cases():
            for direct in (False, True):
                with self.subTest(mla=mla, layout=layout, direct=direct):
                    root = os.path.join(self.dir.name, f"{layout}-{mla}-{direct}")
                    os.makedirs(root)
                    theirs_pool, ours_pool = host_pool(layout, mla), host_pool(layout, mla)
                    theirs = NIXL(
                        storage_config(mla, {"use_direct_io": direct, "l3_cleaner_enabled": False}),
                        file_path=root,
                    )
                    self.addCleanup(theirs.close)
                    theirs.register_mem_pool_host(theirs_pool)
                    ours = self.Backend(config(root, mla, {
                        "naming": "sglang", "page_format": "raw", "use_direct_io": direct,
                    }), {})
                    self.addCleanup(ours.close)
                    ours.register_mem_pool_host(ours_pool)

                    # SGLang writes, hicache reads.
                    fill(theirs_pool, seed=11)
                    keys = [f"a{p:063x}" for p in range(3)]
                    self.assertEqual(theirs.batch_set_v1(keys, slots([1, 2, 3])), [True] * 3)
                    self.assertEqual(ours.batch_exists(keys), 3)
                    self.assertEqual(ours.batch_get_v1(keys, slots([5, 6, 7])), [True] * 3)
                    self.assertEqual(flat_pages(ours_pool, [5, 6, 7]), flat_pages(theirs_pool, [1, 2, 3]))

                    # hicache writes, SGLang reads.
                    fill(ours_pool, seed=12)
                    keys = [f"b{p:063x}" for p in range(3)]
                    self.assertEqual(ours.batch_set_v1(keys, slots([8, 9, 10])), [True] * 3)
                    self.assertEqual(theirs.batch_exists(keys), 3)
                    self.assertEqual(theirs.batch_get_v1(keys, slots([12, 13, 14])), [True] * 3)
                    self.assertEqual(flat_pages(theirs_pool, [12, 13, 14]), flat_pages(ours_pool, [8, 9, 10]))


if __name__ == "__main__":
    unittest.main()
