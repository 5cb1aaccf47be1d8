"""The fast paths of a Python worker on a daemon of arenas (issue 32):
block tables over an arena read in place, tensors born in the shared buffer,
and the step with tensors. Every read is checked byte for byte against get.
"""
import gc

import numpy as np
import pytest
import torch

import kvcache

L, H, D, PT = 3, 2, 64, 16
DTYPES = ["f32", "f16", "bf16", "int8", "fp8_e4m3", "fp8_e5m2", "q8_0", "q4_0"]


@pytest.fixture
def ac(arena_client):
    return arena_client


def layout(dtype="f32", **kw):
    return kvcache.Layout(L, H, D, dtype, page_tokens=PT, **kw)


def kv(n, seed=0, dtype=np.float32):
    r = np.random.default_rng(seed)
    return (r.standard_normal((L, n, H, D)).astype(dtype),
            r.standard_normal((L, n, H, D)).astype(dtype))


def history(arena_arr, bt, layer, begin, end, first_pos):
    """Rows [begin, end) of one layer read through a block table."""
    rows = arena_arr[bt, layer]  # [pages, page_tokens, heads, dim]
    rows = rows.reshape((-1,) + rows.shape[2:])
    return rows[begin - first_pos:end - first_pos]


def stored(c, seq, b, e, dtype):
    """What the cache stores for [b, e): get's natural dtype, or int8's raw bytes."""
    if dtype == "int8":
        k, v, ks, vs = c.get_raw(seq, b, e)
        return k, v, ks, vs
    k, v = c.get(seq, b, e)
    return k, v, None, None


@pytest.mark.parametrize("dtype", DTYPES)
def test_block_tables_read_what_get_reads_every_dtype(ac, dtype):
    c = ac.open_cache("bt-" + dtype, layout(dtype))
    k, v = kv(45, 1)
    c.put(1, 0, k, v)  # 45 tokens: 3 pages, the last one partly filled
    gk, gv, gks, gvs = stored(c, 1, 3, 45, dtype)
    with c.lease(1, 3, 45) as lease:
        bt, a = lease.block_table, lease.arena
        assert bt.dtype == np.int32 and len(bt) == 3 and lease.first_pos == 0
        assert a is c.arena() and a.dtype == dtype and not a.k.flags.writeable
        for layer in range(L):
            assert np.array_equal(history(a.k, bt, layer, 3, 45, 0), gk[layer])
            assert np.array_equal(history(a.v, bt, layer, 3, 45, 0), gv[layer])
            if a.kv is not None:
                assert np.array_equal(a.kv[bt, layer, 1], a.v[bt, layer])
            if dtype == "int8":
                assert np.array_equal(history(a.k_scale, bt, layer, 3, 45, 0), gks[layer])
                assert np.array_equal(history(a.v_scale, bt, layer, 3, 45, 0), gvs[layer])
        # The per-page views (compatibility) read the same bytes.
        if dtype != "int8":
            assert np.array_equal(np.concatenate(lease.k(2)), gk[2])
        # The torch form: the same memory, the dtype's torch type.
        t = a.torch()
        got = history(t.k, torch.from_numpy(bt).long(), 1, 3, 45, 0)
        if dtype == "bf16":
            assert got.dtype == torch.bfloat16
        raw = got.contiguous().view(torch.uint8).numpy()  # the same bits as get's
        assert np.array_equal(raw.reshape(-1), np.ascontiguousarray(gk[1]).view(np.uint8).reshape(-1))


def test_block_tables_after_copy_on_write_shift_and_eviction(ac):
    c = ac.open_cache("bt-cow", layout("f32", rope_dims=D, rope_style="neox"))
    k, v = kv(40, 2)
    c.put(1, 0, k, v)
    c.copy_prefix(1, 2, 40)  # shares every page
    with c.lease(1, 0, 40) as l1, c.lease(2, 0, 40) as l2:
        assert np.array_equal(l1.block_table, l2.block_table)
        bt0 = l1.block_table
    k2, v2 = kv(1, 3)
    c.put(2, 39, k2, v2)  # a write into the shared last page copies it
    c.remove(1, 6, 10)  # a context shift: later tokens move down by 4, keys re-rotated
    for seq, n in ((1, 36), (2, 40)):
        gk, gv = c.get(seq, 0, n)
        with c.lease(seq, 0, n) as lease:
            bt, a = lease.block_table, lease.arena
            for layer in range(L):
                assert np.array_equal(history(a.k, bt, layer, 0, n, lease.first_pos), gk[layer])
                assert np.array_equal(history(a.v, bt, layer, 0, n, lease.first_pos), gv[layer])
    with c.lease(1, 0, 36) as l1, c.lease(2, 0, 40) as l2:
        # seq 2 copied the last page it wrote into and keeps the two before;
        # seq 1's shift rewrote the two it shared, each copied first
        assert np.array_equal(l2.block_table[:2], bt0[:2]) and l2.block_table[2] != bt0[2]
        assert not set(l1.block_table) & set(l2.block_table)
    # Eviction: another cache of this tenant fills the pool; an evicted
    # sequence cannot be leased, a kept one reads what get reads.
    c.pin(2)
    big = ac.open_cache("bt-big", layout("f32"))
    kb, vb = kv(PT * 8, 4)
    for s in range(1000):
        try:
            big.put(s, 0, kb, vb)
        except kvcache.FullError:
            break
    with pytest.raises(kvcache.NoseqError):
        c.lease(1, 0, 36)
    gk, gv = c.get(2, 0, 40)
    with c.lease(2, 0, 40) as lease:
        bt, a = lease.block_table, lease.arena
        assert np.array_equal(history(a.k, bt, 0, 0, 40, 0), gk[0])
    c.unpin(2)
    big.drop()


def test_views_read_zeros_after_release_and_close(arena_daemon):
    c = kvcache.Client(socket=arena_daemon.sock, timeout=10)
    ca = c.open_cache("zeros", layout("f32"))
    k, v = kv(20, 5)
    ca.put(1, 0, k, v)
    with ca.lease(1, 0, 20) as lease:
        pages = lease.k(0)
        bt, a = lease.block_table, lease.arena
        ak, tk = a.k, a.torch().k
        assert np.array_equal(np.concatenate(pages), k[0])
    assert all((p == 0).all() for p in pages)  # the lease's views: zeros after release
    with pytest.raises(ValueError):
        ak[0, 0, 0, 0, 0] = 1  # read-only
    assert a.alive
    c.close()
    assert not a.alive
    assert (ak[bt] == 0).all() and float(tk[torch.from_numpy(bt).long()].abs().sum()) == 0
    del pages, ak, tk, a, lease, ca, c
    gc.collect()  # the handed-over arena view is unmapped with its last array


def test_shm_tensors_put_and_get_with_no_copy(ac):
    c = ac.open_cache("shm-born", layout("bf16"))
    n = 64
    per_token = L * H * D * 2
    k = ac.shm_tensor((L, n, H, D), "bf16")
    v = ac.shm_tensor((L, n, H, D), torch.bfloat16)
    assert k.dtype == torch.bfloat16 and k.is_contiguous()
    k.copy_(torch.randn(L, n, H, D))
    v.copy_(torch.randn(L, n, H, D))
    c.put(1, 0, k, v)
    blocks = ac.shm_blocks
    assert len(blocks) == 2 and blocks[-1][0] + blocks[-1][1] <= len(ac.shm)
    # Fill the buffer with blocks until the library's part cannot hold one
    # token: shm-born tensors still move (by offset), a tensor from
    # elsewhere is refused, as the library would have to copy it.
    fill = []
    while True:
        low = ac.shm_blocks[0][0]
        if low < 2 * per_token:
            break
        fill.append(ac.shm_array(low - per_token // 2 if low > 4096 else 1024, "uint8"))
    assert ac.shm_blocks[0][0] < 2 * per_token
    far_k, far_v = k.clone(), v.clone()
    with pytest.raises(kvcache.SizeError):
        c.put(2, 0, far_k, far_v)
    c.put(3, 0, k, v)  # by offset: no room needed below the blocks
    del fill
    gc.collect()
    ok, ov = ac.shm_tensor((L, n, H, D)), ac.shm_tensor((L, n, H, D))
    c.get(3, 0, n, out=(ok, ov))  # lands in the shm-born tensors
    assert torch.equal(ok, k) and torch.equal(ov, v)
    gk, gv = c.get(1, 0, n)
    assert np.array_equal(gk, k.view(torch.int16).numpy().view(np.uint16))
    # A NumPy array born there, and get_batch / put_batch of them.
    na = ac.shm_array((L, 2, H, D), "bf16")
    nb = ac.shm_array((L, 2, H, D), "bf16")
    c.put_batch([kvcache.PutEntry(4, 0, gk[:, :2].copy(), gv[:, :2].copy())])
    c.get_batch([kvcache.GetEntry(4, 0, 2, na, nb)])
    assert np.array_equal(na, gk[:, :2]) and np.array_equal(nb, gv[:, :2])
    (nk, nv), = c.get_batch([kvcache.GetEntry(4, 0, 2)])  # defaults: new arrays
    assert np.array_equal(nk, na)
    # The offsets of such arrays, for the direct forms' entries.
    c.put_shm([kvcache.ShmEntry(6, 0, 2, ac.shm_offset(na), ac.shm_offset(nb))])
    assert np.array_equal(c.get(6, 0, 2)[1], gv[:, :2])
    with pytest.raises(ValueError, match="not inside"):
        ac.shm_offset(gk)
    c.put_batch([(5, 0, na, nb)])
    assert np.array_equal(c.get(5, 0, 2)[0], gk[:, :2])
    # A view keeps its block; the block goes with its last tensor.
    nblk = len(ac.shm_blocks)
    row = ok[0]
    del ok
    gc.collect()
    assert len(ac.shm_blocks) == nblk
    del row
    gc.collect()
    assert len(ac.shm_blocks) == nblk - 1
    with pytest.raises(MemoryError):
        ac.shm_array(len(ac.shm) + 1, "uint8")


def test_shm_tensor_after_close_reads_zeros(arena_daemon):
    c = kvcache.Client(socket=arena_daemon.sock, timeout=10)
    t = c.shm_tensor((4, 1024), "f32")
    t.fill_(3.0)
    c.close()
    assert float(t.abs().sum()) == 0
    t.fill_(1.0)  # writable, private: no effect on anything
    with pytest.raises(ValueError):
        c.shm_tensor(16)


def test_step_with_tensors_leases_block_tables(ac):
    c = ac.open_cache("step-io", layout("bf16"))
    seqs = [1, 2, 3]
    hist = {}
    for s in seqs:
        k = torch.randn(L, 20 + s, H, D).to(torch.bfloat16)
        v = torch.randn(L, 20 + s, H, D).to(torch.bfloat16)
        c.put(s, 0, k, v)
        hist[s] = (k, v)
    # One write from elsewhere (copied in C), one born in the buffer, one
    # with token ids; NumPy bits for the third.
    nk = [torch.randn(L, 1, H, D).to(torch.bfloat16) for _ in seqs]
    nv = [torch.randn(L, 1, H, D).to(torch.bfloat16) for _ in seqs]
    sk, sv = ac.shm_tensor((L, 1, H, D)), ac.shm_tensor((L, 1, H, D))
    sk.copy_(nk[1])
    sv.copy_(nv[1])
    writes = [kvcache.StepWrite(1, 21, nk[0], nv[0]),
              kvcache.StepWrite(2, 22, sk, sv),
              kvcache.StepWrite(3, 23, nk[2].view(torch.int16).numpy().view(np.uint16),
                                nv[2].view(torch.int16).numpy().view(np.uint16), [7])]
    st = c.step(writes=writes, view="lease", no_mask=True)
    assert isinstance(st, kvcache.StepView) and st.mask is None
    assert st.block_tables.shape[0] == 3 and st.block_tables.dtype == np.int32
    assert list(st.ends) == [22, 23, 24] and list(st.starts) == [0, 0, 0]
    t = st.arena.torch()
    for i, s in enumerate(seqs):
        want_k = torch.cat([hist[s][0], nk[i]], 1)
        want_v = torch.cat([hist[s][1], nv[i]], 1)
        bt = torch.from_numpy(st.block_tables[i]).long()
        for layer in range(L):
            got_k = t.k[bt, layer].reshape(-1, H, D)[:st.ends[i]]
            got_v = t.v[bt, layer].reshape(-1, H, D)[:st.ends[i]]
            assert torch.equal(got_k, want_k[layer]) and torch.equal(got_v, want_v[layer])
        assert np.array_equal(st.leases[i].block_table,
                              st.block_tables[i][:len(st.leases[i].block_table)])
    for le in st.leases:
        le.release_later()
    # The gathered view of the same, and None for view=None.
    g = c.step(writes=[kvcache.StepWrite(1, 22, nk[0], nv[0])], view="gather", copy=True)
    assert g.k.shape == (L, 23, H, D) and g.mask.shape == (1, 23)
    assert c.step(writes=[kvcache.StepWrite(1, 23, nk[0], nv[0])], view=None) is None
    assert c.info(1)["length"] == 24
    # Refusals name what is wrong and change nothing.
    with pytest.raises(ValueError, match="StepWrite"):
        c.step(writes=[(1, 24, nk[0])])
    # Several tokens without the mask: the leases cover them, the kernel masks.
    two = c.step(writes=[kvcache.StepWrite(1, 24, torch.cat([nk[0]] * 2, 1),
                                           torch.cat([nv[0]] * 2, 1))], no_mask=True)
    assert two.mask is None and list(two.ends) == [26]
    for le in two.leases:
        le.release()
    with pytest.raises(kvcache.InvalError, match="lease view"):
        c.step(writes=[kvcache.StepWrite(1, 26, nk[0], nv[0])], view="gather", no_mask=True)
    with pytest.raises(ValueError, match="writes= goes without"):
        c.step([(1, 26, 1, 0, 0)], writes=[])
    assert c.info(1)["length"] == 26


def test_step_writes_larger_than_the_library_part_fail_clearly(arena_daemon):
    with kvcache.Client(socket=arena_daemon.sock, timeout=10, shm_bytes=1 << 20) as ac:
        c = ac.open_cache("step-big", layout("f32"))
        k = torch.randn(L, 600, H, D)  # 900 KiB of K, as much V: more than 1 MiB
        with pytest.raises(kvcache.SizeError, match="shm_tensor"):
            c.step(writes=[kvcache.StepWrite(1, 0, k, k)], view=None)
        assert c.seqs() == []


def test_without_arenas_the_step_works_and_block_tables_say_why_not(client):
    """A daemon still run with page_bytes (deprecated) has no arena views:
    the step with tensors works, its view has no block tables, and asking a
    lease for one says why."""
    c = client.open_cache("legacy-step", kvcache.Layout(L, H, D, "f32", page_tokens=16))
    k, v = kv(20, 8)
    c.put(1, 0, k, v)
    nk, nv = kv(1, 9)
    st = c.step(writes=[kvcache.StepWrite(1, 20, nk, nv)], view="lease", no_mask=True)
    assert st.block_tables is None and st.arena is None and len(st.leases) == 1
    lease = st.leases[0]
    assert np.array_equal(np.concatenate(lease.k(1)), np.concatenate([k[1], nk[1]]))
    with pytest.raises(ValueError, match="arenas"):
        lease.block_table
    assert lease.arena is None and c.arena() is None
    lease.release()
