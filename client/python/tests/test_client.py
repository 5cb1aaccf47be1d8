"""kvcache against a real kvcached: every call of the C API through Python,
values checked; bad input raises, never crashes."""
import os
import re
import signal
import threading
import time

import numpy as np
import pytest
import torch

import kvcache

L, H, D = 2, 2, 32


def layout(dtype="f32", **kw):
    return kvcache.Layout(L, H, D, dtype, **kw)


def kv(n, seed=0, dtype=np.float32):
    r = np.random.default_rng(seed)
    return (r.standard_normal((L, n, H, D)).astype(dtype),
            r.standard_normal((L, n, H, D)).astype(dtype))


# ---- errors -------------------------------------------------------------------

def test_one_exception_class_per_error_code():
    hdr = open(os.path.join(os.environ.get("KVC_SRCDIR", "."), "include/kvcache/errors.h")).read()
    codes = {int(c): n for n, c in re.findall(r"XX\((\w+),\s*(-\d+),", hdr)}
    assert len(codes) >= 42
    assert set(kvcache.errors) == set(codes)
    for code, name in codes.items():
        cls = kvcache.errors[code]
        assert cls.__name__ == "".join(w.capitalize() for w in name.split("_")) + "Error"
        assert issubclass(cls, kvcache.Error) and cls.code == code
        assert getattr(kvcache, cls.__name__) is cls
    assert kvcache.FullError.code == -3


def test_error_carries_code_name_and_daemon_message(client):
    c = client.open_cache("err", layout())
    with pytest.raises(kvcache.NoseqError) as e:
        c.get(12345, 0, 1)
    assert e.value.code == -5 and e.value.name == "NOSEQ" and "12345" in e.value.message
    with pytest.raises(kvcache.LayoutError) as e:
        client.open_cache("err", layout("bf16"))
    assert "exists with another layout: dtype f32 (asked bf16)" in e.value.message
    with pytest.raises(kvcache.NocacheError):
        client.open_cache("no-such-cache")


def test_full_error_carries_needed_and_freeable():
    from conftest import Daemon
    d = Daemon(pool="1MiB", page="64KiB", shm="4MiB")
    try:
        with kvcache.Client(socket=d.sock) as cl:
            c = cl.open_cache("full", kvcache.Layout(1, 4, 128, "f32", page_tokens=16))
            k = np.ones((1, 256, 4, 128), np.float32)  # 16 pages (64 KiB: 16 tokens of K and V)
            with pytest.raises(kvcache.FullError) as e:
                c.put_batch([(1, 0, k, k), (2, 0, k, k)])  # one request: 32 pages > the pool
            assert e.value.needed >= 32 and e.value.freeable < e.value.needed
            assert e.value.code == -3
            with pytest.raises(kvcache.NoseqError):
                c.info(1)  # all or nothing
    finally:
        assert d.stop() == 0


# ---- put / get ------------------------------------------------------------------

def test_put_get_roundtrip_numpy(client):
    c = client.open_cache("rt", layout())
    k, v = kv(40)
    c.put(1, 0, k, v)
    c.put(1, 40, k[:, :3].copy(), v[:, :3].copy())
    k2, v2 = c.get(1, 0, 40)
    assert np.array_equal(k2, k) and np.array_equal(v2, v)
    assert c.info(1)["length"] == 43
    tk, tv = c.get_token(1, 5)
    assert tk.shape == (L, H, D) and np.array_equal(tk, k[:, 5])
    hk, hv = c.get_head(1, 1, 0, 2, 9)
    assert np.array_equal(hk, k[1, 2:9, 0]) and np.array_equal(hv, v[1, 2:9, 0])
    lk, lv = c.get(1, 0, 40, layers=(1, 2), heads=(1, 2))
    assert np.array_equal(lk, k[1:2, :, 1:2])


def test_put_get_memoryview_and_out(client):
    c = client.open_cache("mv", layout())
    k, v = kv(8, 1)
    c.put(2, 0, memoryview(k), memoryview(v))
    ok, ov = np.empty_like(k), np.empty_like(v)
    rk, rv = c.get(2, 0, 8, out=(ok, ov))
    assert rk is ok and np.array_equal(ok, k) and np.array_equal(ov, v)


@pytest.mark.parametrize("dtype,tdtype", [("bf16", torch.bfloat16), ("f16", torch.float16),
                                          ("f32", torch.float32)])
def test_torch_tensors_in_and_out_without_copy(client, dtype, tdtype):
    c = client.open_cache("torch-" + dtype, layout(dtype))
    k = torch.randn(L, 10, H, D).to(tdtype)
    v = torch.randn(L, 10, H, D).to(tdtype)
    c.put(3, 0, k, v)
    ok, ov = torch.empty_like(k), torch.empty_like(v)
    ptr = ok.data_ptr()
    c.get(3, 0, 10, out=(ok, ov))
    assert ok.data_ptr() == ptr and torch.equal(ok, k) and torch.equal(ov, v)
    nk, nv = c.get(3, 0, 10)  # NumPy: bf16 as uint16 bits
    assert torch.equal(kvcache.torch_view(nk).to(tdtype), k)
    f32 = torch.empty(L, 10, H, D)  # a float32 out gets f32
    c.get(3, 0, 10, out=(f32, torch.empty(L, 10, H, D)))
    assert torch.equal(f32, k.float())


def test_put_f32_into_bf16_cache_and_get_f32(client):
    c = client.open_cache("conv", layout("bf16"))
    k, v = kv(4, 2)
    c.put(1, 0, k, v)
    gk, _ = c.get(1, 0, 4, dtype="f32")
    assert gk.dtype == np.float32
    assert np.allclose(gk, k, rtol=1e-2, atol=1e-2)


def test_int8_cache_quantizes_and_reads_raw(client):
    c = client.open_cache("q8", layout("int8"))
    k, v = kv(20, 3)
    c.put(1, 0, k, v)
    gk, gv = c.get(1, 0, 20)
    assert gk.dtype == np.float32
    assert np.abs(gk - k).max() <= np.abs(k).max(axis=-1, keepdims=True).max() / 127 + 1e-6
    rk, rv, sk, sv = c.get_raw(1, 0, 20)
    assert rk.dtype == np.int8 and sk.shape == (L, 20, H)
    assert np.allclose(rk.astype(np.float32) * sk[..., None], gk, atol=1e-6)
    with pytest.raises(kvcache.DtypeError):
        client.open_cache("rt2", layout()).get_raw(1, 0, 1)


@pytest.mark.parametrize("name,tname", [("fp8_e4m3", "float8_e4m3fn"), ("fp8_e5m2", "float8_e5m2")])
def test_fp8_cache_as_given_converted_and_leased(client, name, tname):
    tdt = getattr(torch, tname, None)
    assert kvcache.Layout(L, H, D, tdt or name).dtype == name
    c = client.open_cache("c" + name, layout(name))
    codes = np.random.default_rng(9).integers(0, 256, (2, L, 12, H, D), dtype=np.uint8)
    c.put(1, 0, codes[0], codes[1])  # uint8 codes are stored as given, NaN codes too
    gk, gv = c.get(1, 0, 12)
    assert gk.dtype == np.uint8 and np.array_equal(gk, codes[0]) and np.array_equal(gv, codes[1])
    with c.lease(1, 0, 12) as lease:  # zero-copy views read the same bytes
        assert np.array_equal(np.concatenate(lease.k(1)), codes[0][1])
    if tdt is not None:  # torch float8 tensors in and out, bit for bit
        tk = kvcache.torch_view(gk, name)
        assert tk.dtype == tdt
        c.put(2, 0, tk, kvcache.torch_view(gv, name))
        ok, ov = torch.empty_like(tk), torch.empty_like(tk)
        c.get(2, 0, 12, out=(ok, ov))
        assert np.array_equal(ok.view(torch.uint8).numpy(), codes[0])
    k, v = kv(12, 4)
    c.put(3, 0, k, v)  # converted: round to nearest even, as torch's cast
    g3, _ = c.get(3, 0, 12, dtype="f32")
    if tdt is not None:
        assert np.array_equal(g3, torch.from_numpy(k).to(tdt).float().numpy())
        # vLLM's scales: (x / k_scale).to(fp8) stored, code * scale read back
        c.put(5, 0, k, v, k_scale=0.25, v_scale=3.0)
        ck, cv = c.get(5, 0, 12)
        tk, tv = torch.from_numpy(k), torch.from_numpy(v)
        assert np.array_equal(ck, (tk / 0.25).to(tdt).view(torch.uint8).numpy())
        assert np.array_equal(cv, (tv / 3.0).to(tdt).view(torch.uint8).numpy())
        sk, _ = c.get(5, 0, 12, dtype="f32", k_scale=0.25, v_scale=3.0)
        assert np.array_equal(sk, ((tk / 0.25).to(tdt).float() * 0.25).numpy())
        with pytest.raises(kvcache.DtypeError):
            c.put(6, 0, codes[0], codes[1], k_scale=2.0)  # bytes as given take no scale
    # half a step: relative in the normal range, half the least subnormal below
    rel, sub = (2.0 ** -4, 2.0 ** -10) if name == "fp8_e4m3" else (2.0 ** -3, 2.0 ** -17)
    assert np.all(np.abs(g3 - k) <= np.abs(k) * rel + sub)
    bk = torch.empty(L, 12, H, D, dtype=torch.bfloat16)  # a bf16 out gets bf16
    c.get(3, 0, 12, out=(bk, torch.empty_like(bk)))
    assert torch.equal(bk.float(), torch.from_numpy(g3))
    with pytest.raises(ValueError):
        c.put(4, 0, k.astype(np.float64), v.astype(np.float64))


def _q8_0_ref(x):
    """ggml's quantize_row_q8_0_ref over the last axis (a multiple of 32), in f32."""
    b = x.reshape(-1, 32).astype(np.float32)
    d = (np.abs(b).max(axis=1) / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = (b * inv[:, None]).astype(np.float32)
    q = (np.sign(q) * np.floor(np.abs(q) + np.float32(0.5))).astype(np.int8)  # roundf
    out = np.empty((b.shape[0], 34), np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out


@pytest.mark.parametrize("name,bb", [("q8_0", 34), ("q4_0", 18)])
def test_ggml_block_cache_as_given_converted_and_leased(client, name, bb):
    with pytest.raises(kvcache.HeaddimError):
        client.open_cache("bad" + name, kvcache.Layout(L, H, 48, name))
    c = client.open_cache("c" + name, layout(name))
    blocks = np.random.default_rng(5).integers(0, 256, (2, L, 9, H, D // 32 * bb), dtype=np.uint8)
    c.put(1, 0, blocks[0], blocks[1])  # ggml's bytes, as given
    gk, gv = c.get(1, 0, 9)
    assert gk.dtype == np.uint8 and gk.shape == (L, 9, H, D // 32 * bb)
    assert np.array_equal(gk, blocks[0]) and np.array_equal(gv, blocks[1])
    with c.lease(1, 0, 9) as lease:
        assert np.array_equal(np.concatenate(lease.v(1)), blocks[1][1])
    hk, hv, _, _ = c.history([(1, 8)])  # the blocks a token attends to, as given
    assert hk.shape == (L, 9, H, D // 32 * bb) and np.array_equal(hk, blocks[0])
    k, v = kv(9, 8)
    c.put(2, 0, k, v)  # f32 quantized by ggml's reference
    qk, _ = c.get(2, 0, 9, dtype=name)
    if name == "q8_0":
        assert np.array_equal(qk.reshape(-1, 34), _q8_0_ref(k))
    back, _ = c.get(2, 0, 9, dtype="f32")
    d = np.abs(qk.reshape(-1, bb)[:, :2].copy().view(np.float16).astype(np.float32))
    err = np.abs(back - k).reshape(-1, 32)
    # half a step (a whole one for q4_0's clamped code 15), plus d's f16 rounding
    assert np.all(err <= d * (0.5 if name == "q8_0" else 1.0) + d * 128 / 2048 + 1e-7)
    k[0, 0, 0, 0] = np.nan
    with pytest.raises(kvcache.NonfiniteError):
        c.put(3, 0, k, v)


def test_batches_one_request(client):
    c = client.open_cache("batch", layout())
    ents = [(s, 0) + kv(s + 1, s) for s in range(5)]
    before = client.stats(cache="batch")["caches"]["batch"]
    c.put_batch(ents)
    out = c.get_batch([(s, 0, s + 1) for s in range(5)])
    for (s, _, k, v), (gk, gv) in zip(ents, out):
        assert np.array_equal(gk, k) and np.array_equal(gv, v)
    st = client.stats()
    assert st["requests_total{op=put}"] >= 1
    with pytest.raises(kvcache.DupseqError):
        c.put_batch([ents[0], ents[0]])


def test_tokens_match_attach_and_prefix(client):
    c = client.open_cache("pfx", layout())
    k, v = kv(40, 4)
    ids = np.arange(100, 140, dtype=np.uint32)
    c.put(1, 0, k, v, tokens=ids)
    m = c.match(list(range(100, 140)))
    assert m == {"tokens": 32, "pages": 2, "ineligible": 8}
    a = c.attach(7, ids, pin=True)
    assert a["tokens"] == 32 and c.info(7)["length"] == 32 and c.info(7)["pins"] == 1
    gk, _ = c.get(7, 0, 32)
    assert np.array_equal(gk, k[:, :32])
    assert c.prefix_top(5)[0]["depth"] >= 2
    c.set_extra(b"lora-1")
    assert c.match(ids)["tokens"] == 0
    with pytest.raises(ValueError):
        c.put(2, 0, k, v, tokens=[1, 2, 3])


def test_subscribe_receives_the_prefix_index_changes(shared_daemon):
    """A real subscriber: stored pages as they enter the index (one cache's,
    with their ids, chained by parent hashes), then the removal and the
    clear; nothing of another cache; no other call while subscribed."""
    with kvcache.Client(socket=shared_daemon.sock, timeout=10) as sub, \
            kvcache.Client(socket=shared_daemon.sock, timeout=10) as w:
        c = w.open_cache("evs", layout())
        other = w.open_cache("evs-other", layout())
        sub.subscribe("evs", token_ids=True)
        assert sub.next_event(timeout=0) is None  # nothing happened since
        with pytest.raises(kvcache.InvalError):
            sub.ping()
        k, v = kv(40, 4)
        ids = np.arange(100, 140, dtype=np.uint32)
        other.put(1, 0, k, v, tokens=ids)  # another cache: not for this subscriber
        c.put(1, 0, k, v, tokens=ids)  # two whole pages of 16 tokens
        first, second = sub.next_event(timeout=10), sub.next_event(timeout=10)
        for e in (first, second):
            assert e is not None and e["kind"] == "stored" and e["cache"] == "evs"
            assert e["block_size"] == 16 and e["medium"] == "CPU" and e["seq"] >= 1
            assert len(e["hash"]) in (16, 32) and e["missed"] == 0 and e["ts"] > 0
        assert first["parent"] is None and second["parent"] == first["hash"]
        assert first["token_ids"] == list(range(100, 116))
        assert second["token_ids"] == list(range(116, 132))
        c.clear()
        kinds = []
        while not kinds or kinds[-1] != "cleared":
            e = sub.next_event(timeout=10)
            assert e is not None, f"no 'cleared' after {kinds}"
            assert e["cache"] == "evs"
            kinds.append(e["kind"])
        assert kinds == ["removed", "removed", "cleared"]
        assert sub.next_event(timeout=0) is None
    with pytest.raises(ValueError):
        sub.next_event()  # closed
    with kvcache.Client(socket=shared_daemon.sock, timeout=10) as sub:
        with pytest.raises(ValueError, match="timeout"):
            sub.next_event(timeout=-1)
        with pytest.raises(kvcache.InvalError):
            sub.next_event(timeout=0)  # not subscribed
        sub.subscribe()
        with pytest.raises(kvcache.InvalError):
            sub.subscribe()  # already
        # Ctrl-C ends a wait with no bound on a quiet stream: SIGINT once the
        # call is inside the wait (in_call: the GIL released).
        main = threading.get_ident()

        def interrupt():
            while not sub.in_call:
                time.sleep(0.001)
            signal.pthread_kill(main, signal.SIGINT)

        t = threading.Thread(target=interrupt)
        t.start()
        with pytest.raises(KeyboardInterrupt):
            sub.next_event()
        t.join()
        assert not sub.in_call and sub.next_event(timeout=0) is None


def test_span_keys_keep_same_token_prompts_apart(client):
    c = client.open_cache("pfx-mm", layout())
    ids = np.arange(500, 548, dtype=np.uint32)  # 48 tokens: an image's placeholders at [4, 30)
    ka, va = kv(48, 11)
    kb, vb = kv(48, 12)
    c.put(1, 0, ka, va, tokens=ids, span_keys=[(4, 30, b"image-a-hash")])
    c.put(2, 0, kb, vb, tokens=ids, span_keys=[(4, 30, "image-b-hash")])
    assert c.match(ids, span_keys=[(4, 30, b"image-a-hash")])["tokens"] == 48
    assert c.match(ids, span_keys=[(4, 30, b"image-b-hash")])["tokens"] == 48
    assert c.match(ids)["tokens"] == 0  # the ids alone: neither image
    a = c.attach(3, ids, span_keys=[(4, 30, "image-b-hash")])
    assert a["tokens"] == 48
    gk, gv = c.get(3, 0, 48)
    assert np.array_equal(gk, kb) and np.array_equal(gv, vb)
    with pytest.raises(kvcache.InvalError):  # overlapping spans
        c.match(ids, span_keys=[(4, 10, b"x"), (8, 12, b"y")])
    with pytest.raises(ValueError):
        c.match(ids, span_keys=[(4, 10, b"")])
    with pytest.raises(TypeError):
        c.match(ids, span_keys=[(4, 10, 7)])


def test_sequence_operations(client):
    c = client.open_cache("ops", layout(rope_dims=D))
    k, v = kv(48, 5)
    c.put(1, 0, k, v)
    c.copy_prefix(1, 2, 20)
    assert c.info(2)["length"] == 20 and c.info(2)["shared_pages"] >= 1
    assert c.can_resume(1, 48) and not c.can_resume(1, 60)
    c.trim_front(1, 16)
    assert c.info(1)["start"] == 16
    c.pin(2)
    c.unpin(2)
    with pytest.raises(kvcache.NotpinnedError):
        c.unpin(2)
    c.pin(2, ttl_ms=60000)
    c.set_priority(2, 90)
    with pytest.raises(kvcache.InvalError):
        c.set_priority(2, 101)
    c.remove(2, 10)  # truncate
    assert c.info(2)["length"] == 10
    c.put(3, 0, k, v)
    c.remove(3, 4, 12)  # a middle range: later tokens move down
    assert c.info(3)["length"] == 40
    gk, gv = c.get(3, 4, 40)
    assert np.array_equal(gv, v[:, 12:])  # V moves unchanged; K re-rotated
    c.punch(3, 30, 35)
    assert c.pos_range(3) == (0, 39)
    c.shift(3, 36, -1, 10)
    assert c.pos_range(3)[1] == 49
    c.reserve([(4, 0), (4, 1)])
    c.reserve(np.array([[5, 0]], dtype=np.int64))
    assert {s["seq_id"] for s in c.seqs()} >= {1, 2, 3}
    c.keep(3)
    assert [s["seq_id"] for s in c.seqs()] == [3]
    c.remove(3)
    with pytest.raises(kvcache.NoseqError):
        c.info(3)
    c.clear()
    c.drop()
    with pytest.raises(kvcache.NocacheError):
        c.info(1)


def test_stats_and_lists(client):
    client.ping()
    client.open_cache("st", layout()).put(1, 0, *kv(3))
    s = client.stats(cache="st")
    assert s["pool_pages"] > 0 and list(s["caches"]) == ["st"]
    assert s["caches"]["st"]["cache_sequences"] == 1
    assert any(c["name"] == "st" for c in client.list_caches())
    assert client.open_cache("st").layout == layout()


def test_stats_top_caches_and_node_figures(client):
    for i, tokens in enumerate((1, 40, 20)):  # 1, 3 and 2 pages of 16 tokens
        client.open_cache(f"top{i}", layout()).put(1, 0, *kv(tokens))
    node = client.stats(node_only=True)
    assert node["caches"] == {} and node["pool_pages"] > 0
    top = client.stats(top=1000)["caches"]  # every cache of this tenant, most pages first
    pages = [c["cache_pages"] for c in top.values()]
    assert pages == sorted(pages, reverse=True)
    assert top["top1"]["cache_pages"] == 3 and top["top2"]["cache_pages"] == 2
    assert len(client.stats(top=2)["caches"]) == 2
    assert len(client.stats()["caches"]) <= 10  # the default: the 10 holding the most
    with pytest.raises(kvcache.NocacheError):
        client.stats(cache="no-such-cache")
    with pytest.raises(kvcache.InvalError):
        client.stats(cache="top0", top=3)
    with pytest.raises(kvcache.InvalError):
        client.stats(node_only=True, top=3)
    with pytest.raises(ValueError):
        client.stats(top=-1)


# ---- leases, the shared buffer ---------------------------------------------------

def test_lease_views_in_place_then_zeros(client):
    c = client.open_cache("lease", layout())
    k, v = kv(40, 6)
    c.put(1, 0, k, v)
    with c.lease(1, 5, 37) as lease:
        ks, vs = lease.k(1), lease.v(0)
        assert sum(x.shape[0] for x in ks) == 32
        assert np.array_equal(np.concatenate(ks), k[1, 5:37])
        assert np.array_equal(np.concatenate(vs), v[0, 5:37])
        assert not ks[0].flags.writeable
        with pytest.raises(ValueError):
            ks[0][0, 0, 0] = 1
    assert not lease.active
    assert all((x == 0).all() for x in ks)  # invalid, not dangling
    with pytest.raises(ValueError):
        lease.k(0)
    with pytest.raises(kvcache.RangeError):
        c.lease(1, 0, 41)


def test_shm_direct_forms(client):
    c = client.open_cache("shm", layout())
    k, v = kv(6, 7)
    kb, vb, _ = c.xfer_bytes(6, put=True)
    assert kb == k.nbytes
    shm = client.shm
    shm[0:kb] = k.tobytes()
    shm[kb:kb + vb] = v.tobytes()
    c.put_shm([(1, 0, 6, 0, kb)])
    c.get_shm([(1, 0, 6, 4096, 4096 + kb)])
    got = np.frombuffer(shm, np.float32, count=k.size, offset=4096).reshape(k.shape)
    assert np.array_equal(got, k)
    with pytest.raises(kvcache.OffsetError):
        c.get_shm([(1, 0, 6, len(shm) - 8, 0)])


def test_step_one_round_trip_lease_and_gather_views(client):
    """A decode step: the new tokens written and the history view returned in
    one request; the lease view read in place equals the gathered one and
    what was put; a refused step changes nothing."""
    c = client.open_cache("step", layout())
    seqs = [1, 2, 3]
    hist = {s: kv(20, s) for s in seqs}
    for s in seqs:
        c.put(s, 0, *hist[s])
    shm = client.shm
    kb, vb, _ = c.xfer_bytes(1, put=True)

    def new_tokens(pos, seed):
        entries = []
        for i, s in enumerate(seqs):
            k, v = kv(1, seed + s)
            off = i * (kb + vb)
            shm[off:off + kb] = k.tobytes()
            shm[off + kb:off + kb + vb] = v.tobytes()
            entries.append((s, pos, 1, off, off + kb))
            hist[s] = (np.concatenate([hist[s][0], k], axis=1),
                       np.concatenate([hist[s][1], v], axis=1))
        return entries

    before = client.stats()["requests_total{op=step}"] if "requests_total{op=step}" in client.stats() else 0
    k, v, mask, spans = c.step(new_tokens(20, 100), view="gather", copy=True)
    assert client.stats()["requests_total{op=step}"] == before + 1
    assert [sp[0] for sp in spans] == seqs and all(sp[3] == 21 for sp in spans)
    for (s, pos, first, n) in spans:
        assert np.array_equal(k[:, first:first + n], hist[s][0])
        assert np.array_equal(v[:, first:first + n], hist[s][1])
    assert mask.shape == (3, 63) and (mask[0, :21] == 0).all() and np.isinf(mask[0, 21:]).all()
    leases, lmask, lspans = c.step(new_tokens(21, 200), view="lease")
    assert lspans[0][3] == 22 and np.array_equal(lmask[1, 22:44], np.zeros(22, np.float32))
    for lease, (s, pos, first, n) in zip(leases, lspans):
        with lease:
            for layer in range(L):
                assert np.array_equal(np.concatenate(lease.k(layer)), hist[s][0][layer])
                assert np.array_equal(np.concatenate(lease.v(layer)), hist[s][1][layer])
    assert c.step(new_tokens(22, 300), view=None) is None
    leases, nomask, _ = c.step(new_tokens(23, 400), view="lease", no_mask=True)
    assert nomask is None
    for lease in leases:
        lease.release()
    with pytest.raises(kvcache.SizeError):
        c.step(new_tokens(24, 500), view="gather", out=(len(shm) - 4096, 4096))
    assert c.info(1)["length"] == 24  # the refused step wrote nothing
    with pytest.raises(kvcache.DupseqError):
        c.step([(1, 24, 1, 0, kb), (1, 24, 1, 0, kb)], view="gather")
    got = c.lease_batch([(1, 0, 24), (2, 3, 10)])
    with got[0], got[1]:
        assert np.array_equal(np.concatenate(got[1].k(0)), hist[2][0][0, 3:10])
    with pytest.raises(kvcache.NoseqError):
        c.lease_batch([(1, 0, 24), (9, 0, 1)])


def test_created_ids_owned_dropped_and_no_replace(daemon):
    a = kvcache.Client(socket=daemon.sock)
    b = kvcache.Client(socket=daemon.sock)
    ca, cb = a.open_cache("life", layout()), b.open_cache("life", layout())
    ids = ca.create(3) + cb.create(3, owned=True)
    assert len(set(ids)) == 6 and all(i >= 2 ** 63 for i in ids)
    k, v = kv(4)
    cb.put(ids[3], 0, k, v)
    with pytest.raises(kvcache.ExistsError):
        ca.copy_prefix(ids[3], ids[0], 2, replace=False)
    ca.copy_prefix(ids[3], 77, 2, replace=False)
    b.close()  # its owned sequences go with it
    for _ in range(500):
        try:
            ca.info(ids[3])
        except kvcache.NoseqError:
            break
        time.sleep(0.01)
    with pytest.raises(kvcache.NoseqError):
        ca.info(ids[3])
    assert ca.info(ids[0])["length"] == 0 and ca.info(77)["length"] == 2
    a.close()


def test_nope_layout_removes_a_middle_range(client):
    c = client.open_cache("nope", layout(rope_style="none"))
    assert c.layout.rope_style == "none"
    k, v = kv(8, 3)
    c.put(1, 0, k, v)
    c.remove(1, 2, 5)  # the keys move as they are: no RoPE to undo
    gk, gv = c.get(1, 0, 5)
    assert np.array_equal(gk, np.concatenate([k[:, :2], k[:, 5:]], axis=1))
    plain = client.open_cache("rope-less", layout())
    plain.put(9, 0, *kv(4))
    with pytest.raises(kvcache.NoropeError):
        plain.remove(9, 1, 2)


def test_copy_range_is_seq_cp_with_p0(client):
    c = client.open_cache("seqcp", layout())
    k, v = kv(40, 5)
    c.put(1, 0, k, v)
    c.copy_range(1, 2, 17, 33)
    info = c.info(2)
    assert (info["start"], info["length"]) == (17, 33)
    gk, gv = c.get(2, 17, 33)
    assert np.array_equal(gk, k[:, 17:33]) and np.array_equal(gv, v[:, 17:33])
    with pytest.raises(kvcache.RangeError):
        c.get(2, 16, 17)
    with pytest.raises(kvcache.RangeError):
        c.copy_range(1, 3, 20, 20)


def test_llama3_rope_scaling_layout_round_trips(client):
    lay = layout(rope_dims=32, rope_theta=500000.0, rope_scale=8.0, rope_scaling="llama3",
                 rope_lo=1.0, rope_hi=4.0, rope_orig_ctx=8192)
    c = client.open_cache("llama31", lay)
    assert c.layout == lay and c.layout.rope_scaling == "llama3"
    k, v = kv(8, 2)
    c.put(1, 0, k, v)
    c.remove(1, 2, 4)  # re-rotated with the llama3 frequencies
    assert c.info(1)["length"] == 6
    with pytest.raises(kvcache.RopeError):
        client.open_cache("bad-rope", layout(rope_dims=32, rope_scaling="yarn", rope_scale=4.0))
    with pytest.raises(ValueError, match="rope_scaling"):
        layout(rope_dims=32, rope_scaling="ntk")


# ---- bad input -----------------------------------------------------------------

def test_bad_shapes_and_dtypes_say_what_was_expected(client):
    c = client.open_cache("bad", layout())
    k, v = kv(4)
    with pytest.raises(ValueError, match=r"expected shape \(2, 4, 2, 32\).*got shape \(2, 4, 2, 16\)"):
        c.put(1, 0, k, v[..., :16].copy())
    with pytest.raises(ValueError, match="f32"):
        c.put(1, 0, k.astype(np.float64), v.astype(np.float64))
    # A dtype kvcache does not take is named as the caller knows it.
    with pytest.raises(ValueError, match=r"of f32, got shape \(2, 4, 2, 32\) of int32"):
        c.put(1, 0, k.astype(np.int32), v.astype(np.int32))
    with pytest.raises(ValueError, match=r"of torch\.int32"):
        c.put(1, 0, torch.from_numpy(k.astype(np.int32)), torch.from_numpy(v.astype(np.int32)))
    with pytest.raises(ValueError, match="contiguous"):
        c.put(1, 0, k[:, ::2], v[:, ::2])
    with pytest.raises(ValueError, match="contiguous"):
        c.put(1, 0, torch.randn(L, H, 4, D).transpose(1, 2), torch.randn(L, 4, H, D))
    with pytest.raises(TypeError):
        c.put(1, 0, "abc", v)
    with pytest.raises(ValueError, match="read-only"):
        ro = np.zeros_like(k)
        ro.flags.writeable = False
        c.put(1, 0, k, v)
        c.get(1, 0, 4, out=(ro, np.zeros_like(v)))
    with pytest.raises(ValueError):
        c.get(1, 0, 4, out=(np.zeros((1, 2, 3)), np.zeros((1, 2, 3))))
    with pytest.raises(ValueError):
        c.get(1, 0, 4, layers=(1, 5))
    with pytest.raises(ValueError):
        c.get(1, 0, 4, dtype="complex")
    with pytest.raises(ValueError):
        c.put_batch([(1, 0, k)])
    with pytest.raises(ValueError):
        kvcache.Layout(1, 1, 1, "int4")


def test_huge_sizes_raise(client):
    c = client.open_cache("huge", layout())
    c.put(1, 0, *kv(2))
    with pytest.raises((ValueError, kvcache.Error)):
        c.get(1, 0, 2 ** 62)
    with pytest.raises((ValueError, kvcache.Error, OverflowError)):
        c.get(1, 2 ** 64 - 2, 2 ** 64 - 1)
    with pytest.raises(OverflowError):
        c.get(1, 0, 2 ** 64)
    with pytest.raises((ValueError, OverflowError)):
        c.get_head(1, 0, 0, 0, 2 ** 40)
    with pytest.raises(ValueError):
        c.get_batch([(1, 0, 2 ** 31 + 1)])
    with pytest.raises(ValueError):
        c.prefix_top(10 ** 6)
    with pytest.raises(kvcache.RangeError):
        c.put(1, 2 ** 40, *kv(1))


def test_closed_client_and_cache_raise(shared_daemon):
    cl = kvcache.Client(socket=shared_daemon.sock)
    c = cl.open_cache("closed", layout())
    c.put(1, 0, *kv(2))
    lease = c.lease(1, 0, 2)
    views = lease.k(0)
    shm = cl.shm
    cl.close()
    cl.close()  # idempotent
    for call in (cl.ping, cl.stats, lambda: c.get(1, 0, 1), lambda: c.info(1),
                 lambda: lease.k(0), lambda: cl.open_cache("x", layout()), lambda: c.name):
        with pytest.raises(ValueError, match="closed|released"):
            call()
    assert shm[0] == 0 and (views[0] == 0).all()
    shm[0] = 1  # writes to a dead buffer go nowhere, never crash
    c.close()
    lease.release()
    with pytest.raises(kvcache.NotrunningError):
        kvcache.Client(socket=shared_daemon.dir + "/nobody.sock")
    with pytest.raises(ValueError):
        kvcache.Client(socket=shared_daemon.sock, timeout=-1)


def test_two_threads_on_one_client_is_an_error_not_a_crash(shared_daemon):
    cl = kvcache.Client(socket=shared_daemon.sock)
    c = cl.open_cache("threads", layout())
    big = kv(512, 8)
    c.put(1, 0, *big)
    errors, stop = [], threading.Event()

    def hammer():
        while not stop.is_set():
            try:
                c.get(1, 0, 512)
            except RuntimeError as e:
                errors.append(str(e))

    ts = [threading.Thread(target=hammer) for _ in range(3)]
    for t in ts:
        t.start()
    for _ in range(200):
        try:
            c.get(1, 0, 512)
        except RuntimeError as e:
            errors.append(str(e))
        if errors:
            break
    stop.set()
    for t in ts:
        t.join()
    assert errors and "two threads" in errors[0]
    gk, _ = c.get(1, 0, 512)  # the client still works
    assert np.array_equal(gk, big[0])
    cl.close()


def test_gil_is_released_while_a_call_waits(daemon):
    """A call blocked on a stopped daemon lets the main thread run Python."""
    import signal
    cl = kvcache.Client(socket=daemon.sock, timeout=30)
    done = []
    t = threading.Thread(target=lambda: done.append(cl.ping()))
    daemon.proc.send_signal(signal.SIGSTOP)
    try:
        t.start()
        spins = 0
        while not cl.in_call:  # runs only because the waiting thread released the GIL
            spins += 1
        with pytest.raises(RuntimeError, match="two threads"):
            cl.ping()
        assert not done
    finally:
        daemon.proc.send_signal(signal.SIGCONT)
    t.join()
    assert done == [None] and not cl.in_call
    cl.close()


def test_one_client_per_thread_runs_in_parallel(shared_daemon):
    out = []

    def worker(i):
        with kvcache.Client(socket=shared_daemon.sock) as cl:
            c = cl.open_cache("par", layout())
            k, v = kv(8, i)
            for s in range(20):
                c.put(i * 100 + s, 0, k, v)
                out.append(np.array_equal(c.get(i * 100 + s, 0, 8)[0], k))

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(out) == 80 and all(out)


def test_pip_install_offline_from_the_source_tree(shared_daemon, tmp_path):
    """pip install ./client/python with no index (the package's backend finds
    Debian's setuptools and wheel), then the installed copy talks to kvcached."""
    import subprocess
    import sys
    src = os.path.join(os.environ.get("KVC_SRCDIR", "."), "client", "python")
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_ROOT_USER_ACTION="ignore")
    env.pop("PYTHONPATH", None)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target",
                        str(tmp_path), src], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    code = ("import kvcache, sys; c = kvcache.Client(socket=sys.argv[1]); c.ping(); "
            "print(kvcache.__file__)")
    r = subprocess.run([sys.executable, "-c", code, shared_daemon.sock], capture_output=True,
                       text=True, env=dict(env, PYTHONPATH=str(tmp_path)), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(str(tmp_path))


def test_stubs_and_docstrings_cover_everything_public():
    import ast
    import kvcache.connector as conn
    pyi = os.path.join(os.path.dirname(kvcache.__file__), "__init__.pyi")
    tree = ast.parse(open(pyi).read())
    stubs = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    funcs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}

    def stub_names(node):
        return ({n.name for n in node.body if isinstance(n, ast.FunctionDef)} |
                {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)})

    for cls in (kvcache.Client, kvcache.Cache, kvcache.Lease, kvcache.Layout, kvcache.Arena,
                kvcache.StepWrite, kvcache.StepView, kvcache.PutEntry, kvcache.GetEntry,
                kvcache.ShmEntry):
        assert cls.__doc__, cls
        names = stub_names(stubs[cls.__name__])
        for name in dir(cls):
            if name.startswith("_") or (issubclass(cls, tuple) and hasattr(tuple, name)):
                continue
            assert name in names, f"{cls.__name__}.{name} missing from the stubs"
            attr = getattr(cls, name)
            if callable(attr):
                assert attr.__doc__, f"{cls.__name__}.{name} has no docstring"
    for e in kvcache.errors.values():
        assert e.__name__ in stubs and e.__doc__
    assert "torch_view" in funcs
    for f in (conn.gather, conn.scatter, conn.KVConnector.load, conn.KVConnector.save,
              conn.KVConnector.save_layer, conn.KVConnector.load_layer,
              conn.KVConnector.num_cached_tokens, conn.KVConnector.finish):
        assert f.__doc__


def _neox(k, pos, theta=10000.0):
    """k [L, n, H, D] turned to positions pos (NeoX pairs i, i + D/2)."""
    half = D // 2
    freq = theta ** (-2.0 * np.arange(half) / D)
    ang = np.asarray(pos, np.float64)[None, :, None, None] * freq
    a, b = k[..., :half].astype(np.float64), k[..., half:].astype(np.float64)
    return np.concatenate([a * np.cos(ang) - b * np.sin(ang),
                           a * np.sin(ang) + b * np.cos(ang)], axis=-1)


def test_seq_div_self_extend_positions_and_keys(client):
    """llama.cpp's seq_div: positions in [p0, p1) become pos // d, each key
    turned to its new position; the next token goes in the next slot at the
    last position + 1; history reports the positions and masks by them."""
    c = client.open_cache("div", layout(rope_dims=D))
    base, v = kv(12, 7)
    c.put(1, 0, _neox(base, np.arange(12)).astype(np.float32), v)
    with pytest.raises(kvcache.InvalError):
        c.seq_div(1, 0, 12, 0)
    with pytest.raises(kvcache.RangeError):
        c.seq_div(1, 8, 4, 2)
    with pytest.raises(kvcache.NoseqError):
        c.seq_div(9, 0, 4, 2)
    # self-extend, ga_n 2, ga_w 8 at ga_i 0: seq_add(0, 12, 0), seq_div(0, 8, 2),
    # seq_add(8, 12, -4)
    c.shift(1, 0, 12, 0)
    c.seq_div(1, 0, 8, 2)
    c.shift(1, 8, 12, -4)
    want = [q // 2 for q in range(8)] + [4, 5, 6, 7]
    assert c.pos_range(1) == (0, 7)
    gk, gv = c.get(1, 0, 12)
    assert np.allclose(gk, _neox(base, want), atol=1e-4) and np.array_equal(gv, v)
    k1, v1 = kv(1, 8)
    c.reserve([(1, 12)])
    c.put(1, 12, k1, v1)
    want.append(8)
    _, _, mask, spans, pos = c.history([(1, 5), (1, 12)], positions=True)
    assert list(pos) == want and spans == [(1, 0, 0, 13)]
    assert [m == 0 for m in mask[0]] == [p <= want[5] for p in want]  # slot 5 at 2: 0..5
    assert (mask[1] == 0).all()
    # an undivided sequence: the positions are its slots
    c.put(2, 0, *kv(3, 9))
    *_, pos2 = c.history([(2, 2)], positions=True)
    assert list(pos2) == [0, 1, 2]
    w = client.open_cache("divwin", layout(rope_dims=D, attn="window", window=4))
    w.put(1, 0, *kv(4))
    with pytest.raises(kvcache.KindError):
        w.seq_div(1, 0, 4, 2)
