use super::*;

const L: u64 = 3;
const H: u64 = 2;
const D: u64 = 4;
const C: u64 = 6;
const PS: u64 = 2;
const P: u64 = 5;

fn geometry(attention: AttentionKind, layout: Layout) -> PoolGeometry {
    PoolGeometry::new(attention, L, Dtype::Bf16, PS, layout, P).unwrap()
}

fn mha() -> AttentionKind {
    AttentionKind::Mha {
        kv_heads: H,
        head_dim: D,
    }
}

fn mla() -> AttentionKind {
    AttentionKind::Mla { kv_cache_dim: C }
}

/// Element index (not bytes) of (kv, layer, token, head, dim) in SGLang's MHA buffer.
fn mha_index(layout: Layout, kv: u64, l: u64, t: u64, h: u64, d: u64) -> u64 {
    let s = P * PS;
    let (p, i) = (t / PS, t % PS);
    match layout {
        Layout::LayerFirst => (((kv * L + l) * s + t) * H + h) * D + d,
        Layout::PageFirst => (((kv * s + t) * L + l) * H + h) * D + d,
        Layout::PageFirstDirect => ((((kv * P + p) * L + l) * PS + i) * H + h) * D + d,
        Layout::PageHead => ((((kv * P + p) * H + h) * PS + i) * L + l) * D + d,
    }
}

/// Element index of (kv, l, i, h, d) inside a flat page.
fn mha_flat_index(layout: Layout, kv: u64, l: u64, i: u64, h: u64, d: u64) -> u64 {
    match layout {
        Layout::LayerFirst | Layout::PageFirstDirect => (((kv * L + l) * PS + i) * H + h) * D + d,
        Layout::PageFirst => (((kv * PS + i) * L + l) * H + h) * D + d,
        Layout::PageHead => (((kv * H + h) * PS + i) * L + l) * D + d,
    }
}

fn mla_index(layout: Layout, l: u64, t: u64, c: u64) -> u64 {
    let s = P * PS;
    let (p, i) = (t / PS, t % PS);
    match layout {
        Layout::LayerFirst => (l * s + t) * C + c,
        Layout::PageFirst => (t * L + l) * C + c,
        Layout::PageFirstDirect => ((p * L + l) * PS + i) * C + c,
        Layout::PageHead => unreachable!(),
    }
}

fn mla_flat_index(layout: Layout, l: u64, i: u64, c: u64) -> u64 {
    match layout {
        Layout::LayerFirst | Layout::PageFirstDirect => (l * PS + i) * C + c,
        Layout::PageFirst => (i * L + l) * C + c,
        Layout::PageHead => unreachable!(),
    }
}

/// Fills each bf16 element with its own element index, so positions are recognisable.
fn numbered_pool(g: PoolGeometry) -> MmapPool {
    let pool = MmapPool::new(g).unwrap();
    let elems = g.pool_bytes() / 2;
    let bytes: Vec<u8> = (0..elems).flat_map(|i| (i as u16).to_le_bytes()).collect();
    pool.write_bytes(0, &bytes).unwrap();
    pool
}

fn element(flat: &[u8], index: u64) -> u16 {
    let i = index as usize * 2;
    u16::from_le_bytes([flat[i], flat[i + 1]])
}

#[test]
fn mha_gather_matches_sglang_byte_order() {
    for layout in Layout::ALL {
        let g = geometry(mha(), layout);
        assert_eq!(g.page_bytes(), 2 * L * PS * H * D * 2);
        assert_eq!(g.pool_bytes(), g.page_bytes() * P);
        let pool = numbered_pool(g);
        for page in 0..P {
            let mut flat = vec![0u8; g.page_bytes() as usize];
            gather_page(&pool, page, &mut flat).unwrap();
            for kv in 0..2 {
                for l in 0..L {
                    for i in 0..PS {
                        for h in 0..H {
                            for d in 0..D {
                                let want = mha_index(layout, kv, l, page * PS + i, h, d) as u16;
                                let got = element(&flat, mha_flat_index(layout, kv, l, i, h, d));
                                assert_eq!(
                                    got, want,
                                    "{layout} page {page} kv {kv} l {l} i {i} h {h} d {d}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn mla_gather_matches_sglang_byte_order() {
    for layout in [
        Layout::LayerFirst,
        Layout::PageFirst,
        Layout::PageFirstDirect,
    ] {
        let g = geometry(mla(), layout);
        assert_eq!(g.page_bytes(), L * PS * C * 2);
        let pool = numbered_pool(g);
        for page in 0..P {
            let mut flat = vec![0u8; g.page_bytes() as usize];
            gather_page(&pool, page, &mut flat).unwrap();
            for l in 0..L {
                for i in 0..PS {
                    for c in 0..C {
                        let want = mla_index(layout, l, page * PS + i, c) as u16;
                        assert_eq!(
                            element(&flat, mla_flat_index(layout, l, i, c)),
                            want,
                            "{layout}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn span_counts_and_contiguity() {
    assert_eq!(geometry(mha(), Layout::PageFirst).spans_per_page(), 2);
    assert_eq!(geometry(mha(), Layout::LayerFirst).spans_per_page(), 2 * L);
    assert_eq!(geometry(mla(), Layout::PageFirst).spans_per_page(), 1);
    assert_eq!(geometry(mla(), Layout::LayerFirst).spans_per_page(), L);
    // Spans of different pages never overlap and stay inside the pool.
    for attention in [mha(), mla()] {
        for layout in Layout::ALL {
            let Ok(g) = PoolGeometry::new(attention, L, Dtype::Bf16, PS, layout, P) else {
                continue;
            };
            let mut all: Vec<Span> = (0..P).flat_map(|p| g.page_spans(p).unwrap()).collect();
            all.sort_by_key(|s| s.offset);
            for w in all.windows(2) {
                assert!(w[0].offset + w[0].len <= w[1].offset, "{layout}");
            }
            let last = all.last().unwrap();
            assert!(last.offset + last.len <= g.pool_bytes());
            assert_eq!(all.iter().map(|s| s.len).sum::<u64>(), g.pool_bytes());
        }
    }
}

#[test]
fn scatter_round_trips_and_touches_only_its_page() {
    for attention in [mha(), mla()] {
        for layout in Layout::ALL {
            let Ok(g) = PoolGeometry::new(attention, L, Dtype::Bf16, PS, layout, P) else {
                continue;
            };
            let pool = numbered_pool(g);
            let mut before = vec![0u8; g.pool_bytes() as usize];
            pool.read_bytes(0, &mut before).unwrap();
            let flat: Vec<u8> = (0..g.page_bytes()).map(|i| (i % 251) as u8).collect();
            scatter_page(&pool, 3, &flat).unwrap();
            let mut back = vec![0u8; flat.len()];
            gather_page(&pool, 3, &mut back).unwrap();
            assert_eq!(back, flat, "{layout}");
            let mut after = vec![0u8; before.len()];
            pool.read_bytes(0, &mut after).unwrap();
            let page3: Vec<Span> = g.page_spans(3).unwrap().collect();
            for (i, (a, b)) in before.iter().zip(&after).enumerate() {
                let inside = page3
                    .iter()
                    .any(|s| (i as u64) >= s.offset && (i as u64) < s.offset + s.len);
                if !inside {
                    assert_eq!(a, b, "{layout}: byte {i} outside page 3 changed");
                }
            }
        }
    }
}

#[test]
fn bad_geometry_and_indices_are_errors() {
    assert!(PoolGeometry::new(mla(), L, Dtype::Bf16, PS, Layout::PageHead, P).is_err());
    assert!(PoolGeometry::new(mha(), 0, Dtype::Bf16, PS, Layout::PageFirst, P).is_err());
    assert!(PoolGeometry::new(mha(), u64::MAX, Dtype::Bf16, PS, Layout::PageFirst, P).is_err());
    let g = geometry(mha(), Layout::PageFirst);
    assert!(g.page_spans(P).is_err());
    let pool = MmapPool::new(g).unwrap();
    let mut short = vec![0u8; 3];
    assert!(gather_page(&pool, 0, &mut short).is_err());
    let anchor = AnchorPool::new(g).unwrap();
    let mut flat = vec![0u8; g.page_bytes() as usize];
    assert!(gather_page(&anchor, 0, &mut flat).is_err());
}

#[test]
fn alignment_rule() {
    let g = PoolGeometry::new(
        AttentionKind::Mha {
            kv_heads: 8,
            head_dim: 128,
        },
        32,
        Dtype::Bf16,
        64,
        Layout::PageFirst,
        4,
    )
    .unwrap();
    let pool = MmapPool::new(g).unwrap();
    assert_eq!(pool.base() % 4096, 0);
    assert!(g.spans_aligned(pool.base() as u64, 4096));
    assert!(!g.spans_aligned(pool.base() as u64 + 512, 4096));
    let odd = PoolGeometry::new(
        AttentionKind::Mla { kv_cache_dim: 577 },
        g.layers(),
        g.dtype(),
        3,
        g.layout(),
        g.pages(),
    )
    .unwrap();
    assert!(!odd.spans_aligned(0, 4096));
    assert!(odd.spans_aligned(0, 1));
}
