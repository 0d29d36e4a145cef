"""Throughput of hicache's SGLang backend driven as SGLang drives it: batch_set_v1 and
batch_get_v1 of 128 pages a call from several threads at once, over a host pool in a torch
tensor (pinned where CUDA is present), numpy without torch.

    HICACHE_SGLANG_SOURCE=<dir with sglang/> python v1_throughput.py --dir /mnt/kv \
        [--layout page_first] [--pages 2048] [--threads 3] [--rounds 3]

Prints one JSON line per round: GB/s of the writes and of the reads (every page read is a
verified hit; a miss or failure stops the run).
"""

import argparse
import json
import os
import sys
import threading
import time
import types

sys.path.insert(0, os.environ["HICACHE_SGLANG_SOURCE"])
try:
    import torch
except ImportError:
    torch = None
    stand_in = types.ModuleType("torch")
    stand_in.Tensor = type("Tensor", (), {})
    sys.modules["torch"] = stand_in
import numpy as np  # noqa: E402

from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402

from hicache.sglang import HiCacheBackend  # noqa: E402

CALL = 128  # SGLang's STORAGE_BATCH_SIZE


class Pool:
    """An MHA host pool in SGLang's page_first / page_first_direct shapes."""

    def __init__(self, layout, pages, page_size, layers, heads, head_dim):
        self.layout, self.page_size, self.page_num = layout, page_size, pages
        self.size, self.layer_num = pages * page_size, layers
        self.head_num, self.head_dim = heads, head_dim
        dims = {
            "page_first": (2, self.size, layers, heads, head_dim),
            "page_first_direct": (2, pages, layers, page_size, heads, head_dim),
        }[layout]
        if torch is not None:
            pin = torch.cuda.is_available()
            self.kv_buffer = torch.ones(dims, dtype=torch.bfloat16, pin_memory=pin)
            self.dtype = torch.bfloat16
        else:
            self.kv_buffer = np.ones(dims, dtype=np.float16)
            self.dtype = "torch.float16"
        self.page_bytes = self.kv_buffer.nbytes // pages if torch is None else (
            self.kv_buffer.numel() * self.kv_buffer.element_size() // pages
        )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--layout", default="page_first")
    ap.add_argument("--pages", type=int, default=2048)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--threads", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--extra", default="{}", help="more extra-config keys, as JSON")
    a = ap.parse_args()
    pool = Pool(a.layout, a.pages, a.page_size, a.layers, a.heads, a.head_dim)
    extra = {"interface_v1": 1, "storage_dir": a.dir}
    extra.update(json.loads(a.extra))
    cfg = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="bench", extra_config=extra,
    )
    backend = HiCacheBackend(cfg, {})
    backend.register_mem_pool_host(pool)
    half = a.pages // 2  # writes from the first half, reads into the second
    calls = [list(range(s, min(s + CALL, half))) for s in range(0, half, CALL)]

    def run(rnd, write):
        failed = []

        def worker(t):
            for c in calls[t :: a.threads]:
                keys = [f"r{rnd}-p{p}" for p in c]
                pages = c if write else [p + half for p in c]
                idx = np.array([p * a.page_size + i for p in pages for i in range(a.page_size)],
                               dtype=np.int64)
                op = backend.batch_set_v1 if write else backend.batch_get_v1
                if not all(op(keys, idx)):
                    failed.append(c[0])

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(a.threads)]
        start = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        took = time.perf_counter() - start
        if failed:
            raise SystemExit(f"round {rnd}: calls starting at pages {failed} failed")
        return half * pool.page_bytes / took / 1e9

    for rnd in range(a.rounds):
        w = run(rnd, True)
        r = run(rnd, False)
        print(json.dumps({"round": rnd, "page_bytes": pool.page_bytes, "pages": half,
                          "threads": a.threads, "write_gbs": round(w, 2), "read_gbs": round(r, 2)}))
    backend.close()


if __name__ == "__main__":
    main()
