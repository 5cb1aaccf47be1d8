"""kvcache.connector: paged buffers shaped like vLLM's and SGLang's in and out."""
import numpy as np
import pytest
import torch

import kvcache
from kvcache.connector import KVConnector, gather, scatter

L, H, D, BS, NB = 2, 2, 32, 16, 12


def paged(combined, dtype=torch.float32):
    if combined:  # vLLM: [num_blocks, 2, block_size, heads, dim] per layer
        return [torch.zeros(NB, 2, BS, H, D, dtype=dtype) for _ in range(L)]
    return [(torch.zeros(NB, BS, H, D, dtype=dtype), torch.zeros(NB, BS, H, D, dtype=dtype))
            for _ in range(L)]


def fill(kv_layers, slots, seed):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(L, len(slots), H, D, generator=g)
    v = torch.randn(L, len(slots), H, D, generator=g)
    scatter(kv_layers, slots, k, v)
    return k, v


@pytest.mark.parametrize("combined", [True, False])
def test_gather_scatter_roundtrip(combined):
    buf = paged(combined)
    slots = torch.tensor([5 * BS + 3, 2 * BS, 2 * BS + 1, 9 * BS + 15])
    k, v = fill(buf, slots, 1)
    gk, gv = gather(buf, slots)
    assert torch.equal(gk, k) and torch.equal(gv, v) and gk.is_contiguous()
    npbuf = [np.zeros((NB, 2, BS, H, D), np.float32) for _ in range(L)]
    scatter(npbuf, slots.numpy(), k.numpy(), v.numpy())
    nk, _ = gather(npbuf, slots.numpy())
    assert np.array_equal(nk, k.numpy())


@pytest.mark.parametrize("combined", [True, False])
def test_connector_save_then_load_into_other_slots(client, combined):
    layout = kvcache.Layout(L, H, D, "bf16")
    a = KVConnector(client, f"conn-{combined}", layout)
    b = KVConnector(client, f"conn-{combined}", layout)
    tokens = list(range(1000, 1040))  # 40 tokens: 2 full pages are matchable
    src = paged(combined, torch.bfloat16)
    slots_a = torch.randperm(NB * BS)[:40]
    k, v = fill(src, slots_a, 2)
    a.save(1, tokens, src, slots_a)
    assert a.num_cached_tokens(tokens) == 32
    assert b.num_cached_tokens(tokens[:20] + [7] * 20) == 16
    dst = paged(combined, torch.bfloat16)
    slots_b = torch.randperm(NB * BS)[:40]
    n = b.load(2, tokens, dst, slots_b)
    assert n == 32
    gk, gv = gather(dst, slots_b[:32])
    assert torch.equal(gk, k[:, :32].to(torch.bfloat16)) and torch.equal(gv, v[:, :32].bfloat16())
    assert b.cache.info(2)["pins"] == 1
    b.finish(2)
    assert b.cache.info(2)["pins"] == 0
    b.finish(2, keep=False)
    with pytest.raises(kvcache.NoseqError):
        b.cache.info(2)


def test_connector_layer_by_layer(client):
    layout = kvcache.Layout(L, H, D, "f32")
    c = KVConnector(client, "conn-layers", layout)
    src = paged(True)
    slots = torch.arange(10) * 3
    k, v = fill(src, slots, 3)
    c.save_layer(5, 0, src[0], slots, 0)
    assert c.cache.info(5)["length"] == 0  # counted once every layer holds it
    c.save_layer(5, 1, src[1], slots, 0)
    assert c.cache.info(5)["length"] == 10
    dst = paged(False)
    for l in range(L):
        c.load_layer(5, l, dst[l], slots + 1, 0, 10)
    gk, gv = gather(dst, slots + 1)
    assert torch.equal(gk, k) and torch.equal(gv, v)


def test_connector_layer_by_layer_saves_feed_the_prefix_cache(client):
    layout = kvcache.Layout(L, H, D, "f32")
    a = KVConnector(client, "conn-layer-ids", layout)
    b = KVConnector(client, "conn-layer-ids", layout)
    tokens = list(range(3000, 3040))  # 40 tokens: 2 full pages
    src = paged(True)
    slots = torch.randperm(NB * BS)[:40]
    k, v = fill(src, slots, 4)
    for l in range(L):  # vLLM's save_kv_layer, a layer at a time
        assert b.num_cached_tokens(tokens) == 0  # not before every layer is in
        a.save_layer(7, l, src[l], slots[:24], 0, token_ids=tokens[:24])
        a.save_layer(7, l, src[l], slots[24:], 24, token_ids=tokens[24:])
    assert b.num_cached_tokens(tokens) == 32
    dst = paged(False)
    slots_b = torch.randperm(NB * BS)[:40]
    assert b.load(8, tokens, dst, slots_b) == 32
    gk, gv = gather(dst, slots_b[:32])
    assert torch.equal(gk, k[:, :32]) and torch.equal(gv, v[:, :32])
    # one layer saved for other ids: the page is never served for either
    other = [t + 1 for t in tokens]
    for l in range(L):
        a.save_layer(9, l, src[l], slots, 0, token_ids=other if l == 1 else [t + 2 for t in tokens])
    assert b.num_cached_tokens(other) == 0
    assert b.num_cached_tokens([t + 2 for t in tokens]) == 0


def test_connector_bad_buffers_raise(client):
    c = KVConnector(client, "conn-bad", kvcache.Layout(L, H, D, "f32"))
    with pytest.raises(ValueError):
        gather([torch.zeros(NB, 3, BS, H, D)] * L, [0])
    with pytest.raises(ValueError):
        gather(paged(True), [-1])
    with pytest.raises(ValueError):  # wrong heads for the layout
        c.save(1, None, [torch.zeros(NB, 2, BS, H + 1, D)] * L, [0, 1])
