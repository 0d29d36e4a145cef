"""hicache's SGLang backend against SGLang's own NIXL backend (``HiCacheNixl``), driven the
same way, over SGLang's own host pools.

Both backends get the same host pool object, the same keys and the same calls: SGLang's backup
thread's ``batch_set_v1`` and its prefetch thread's ``batch_get_v1``, 128 pages a call (SGLang's
``STORAGE_BATCH_SIZE``), one call at a time per thread. Each repeat writes fresh keys (a
backup writes pages the storage does not have) and reads them back into other host pages; the
order of the backends turns round each repeat. NIXL runs its POSIX plugin in each of its modes
(``use_uring``, ``use_aio``) and the best is the baseline. O_DIRECT on for both (SGLang's NIXL
default). Every page read back is compared with the page written, outside the timing.

Needs what ``tests/test_sglang_host_pools.py`` needs, and the ``nixl`` package::

    CUDA_VISIBLE_DEVICES= HICACHE_SGLANG_SOURCE=<dir> python vs_sglang_nixl.py --dir /mnt/kv \
        [--pages 256] [--repeats 5] [--json out.json]

Prints one line per measurement and a summary: medians in GB/s (1e9 bytes per second) and the
ratio of hicache's median to NIXL's best median.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import test_sglang_host_pools as pools  # noqa: E402

CALL = 128  # SGLang's STORAGE_BATCH_SIZE

# (name, MLA?, layout, pool geometry): a Llama-3-8B-like MHA model in SGLang's default layout
# and its zero-copy layout, and a DeepSeek-V3-like MLA model.
CASES = [
    ("mha-layer_first", False, "layer_first", dict(heads=8, head_dim=128, layers=32)),
    ("mha-page_first_direct", False, "page_first_direct", dict(heads=8, head_dim=128, layers=32)),
    ("mla-page_first", True, "page_first", dict(kv_cache_dim=576, layers=61)),
]
NIXL_MODES = {"uring": "use_uring", "aio": "use_aio"}


def backends(case, root, pool, mla):
    """Every contender for one case: hicache, and SGLang's NIXL backend in each mode."""
    from hicache.sglang import HiCacheBackend

    out = {}
    d = os.path.join(root, "hicache")
    os.makedirs(d)
    b = HiCacheBackend(pools.config(d, mla, {"use_direct_io": True}), {})
    b.register_mem_pool_host(pool)
    out["hicache"] = b
    for mode, key in NIXL_MODES.items():
        d = os.path.join(root, f"nixl-{mode}")
        os.makedirs(d)
        params = {v: "false" for v in NIXL_MODES.values()}
        params[key] = "true"
        params.update(use_direct_io=True, l3_cleaner_enabled=False)
        try:
            b = pools.NIXL(pools.storage_config(mla, params), file_path=d)
            b.register_mem_pool_host(pool)
        except Exception as e:  # a mode this machine's kernel lacks
            print(f"{case}: NIXL {mode} unavailable: {e!r}", flush=True)
            continue
        out[f"nixl-{mode}"] = b
    return out


def run_calls(op, keys, pages, page, threads):
    """``op`` over ``keys``/``pages`` in calls of 128 pages, spread over ``threads``; seconds."""
    calls = [(keys[s : s + CALL], pages[s : s + CALL]) for s in range(0, len(keys), CALL)]
    failed = []

    def worker(t):
        for k, p in calls[t::threads]:
            if not all(op(k, pools.slots(p, page))):
                failed.append(p[0])

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    start = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    took = time.perf_counter() - start
    if failed:
        raise SystemExit(f"calls starting at pages {failed} failed")
    return took


def flat_bytes(pool, page, tokens):
    """SGLang's flat copy of ``page`` as bytes."""
    return pool.get_data_page(page * tokens).view(pools.SG["torch"].uint8)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--pages", type=int, default=256, help="pages written and read per repeat")
    ap.add_argument("--page-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="threads per direction")
    ap.add_argument("--cases", default=",".join(c[0] for c in CASES))
    ap.add_argument("--json")
    a = ap.parse_args()
    if pools.NIXL is None:
        raise SystemExit(f"SGLang's NIXL backend is not available: {pools.NIXL_WHY}")
    os.environ["SGLANG_HICACHE_NIXL_BACKEND_PLUGIN"] = "POSIX"
    torch = pools.SG["torch"]
    results = []
    for case, mla, layout, geometry in CASES:
        if case not in a.cases.split(","):
            continue
        device_pages = 16
        ratio = (2 * a.pages + 1) / device_pages  # source and destination pages, plus one
        pool = pools.host_pool(layout, mla, page=a.page_tokens,
                               device_tokens=device_pages * a.page_tokens, ratio=ratio, **geometry)
        pools.fill(pool, seed=1)
        page_bytes = pool.kv_buffer.numel() * pool.kv_buffer.element_size() // pool.page_num
        root = os.path.join(a.dir, case)
        shutil.rmtree(root, ignore_errors=True)
        contenders = backends(case, root, pool, mla)
        src = list(range(1, a.pages + 1))
        dst = [p + a.pages for p in src]
        # Compared as bytes: random bf16 holds NaNs, which torch.equal counts as unequal.
        want = [flat_bytes(pool, p, a.page_tokens).clone() for p in src]
        zero = torch.zeros_like(pool.get_data_page(0))
        figures = {name: {"write": [], "read": []} for name in contenders}
        names = list(contenders)
        for rep in range(a.repeats):
            order = names[rep % len(names):] + names[: rep % len(names)]
            for name in order:
                b = contenders[name]
                keys = [f"{name}-r{rep}-{p:056x}" for p in src]
                w = run_calls(b.batch_set_v1, keys, src, a.page_tokens, a.threads)
                r = run_calls(b.batch_get_v1, keys, dst, a.page_tokens, a.threads)
                for i, p in enumerate(dst):
                    if not torch.equal(flat_bytes(pool, p, a.page_tokens), want[i]):
                        raise SystemExit(f"{case} {name}: page {p} read back wrong")
                    pool.set_from_flat_data_page(p * a.page_tokens, zero)
                total = a.pages * page_bytes
                figures[name]["write"].append(total / w / 1e9)
                figures[name]["read"].append(total / r / 1e9)
                print(json.dumps({"case": case, "backend": name, "repeat": rep,
                                  "write_gbs": round(total / w / 1e9, 3),
                                  "read_gbs": round(total / r / 1e9, 3)}), flush=True)
                b.clear()
        for b in contenders.values():
            b.close()
        med = {n: {k: statistics.median(v) for k, v in f.items()} for n, f in figures.items()}
        row = {"case": case, "page_bytes": page_bytes, "pages": a.pages, "threads": a.threads,
               "repeats": a.repeats, "median_gbs": med}
        nixl = [n for n in med if n.startswith("nixl")]
        if nixl:
            for k in ("write", "read"):
                best = max(nixl, key=lambda n: med[n][k])
                row[f"{k}_vs_nixl_best"] = round(med["hicache"][k] / med[best][k], 3)
                row[f"{k}_nixl_best_mode"] = best
        results.append(row)
        print(json.dumps(row), flush=True)
        shutil.rmtree(root, ignore_errors=True)
        del pool
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
