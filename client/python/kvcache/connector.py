"""kvcache.connector: what a vLLM or SGLang KV connector needs beyond the raw calls.

An engine keeps its KV cache in paged buffers, per layer either one tensor
[num_blocks, 2, block_size, num_kv_heads, head_dim] (K at [:, 0], V at
[:, 1]) or a (K, V) pair of [num_blocks, block_size, num_kv_heads, head_dim];
a request's tokens live at slots (slot = block * block_size + offset, vLLM's
slot_mapping). kvcached keeps a sequence contiguous by position. These
helpers move tokens between the two, so that a connector is a thin adapter:

  vLLM KVConnectorBase_V1                 kvcache.connector
  ---------------------------------       ------------------------------------
  get_num_new_matched_tokens(req, n)  ->  conn.num_cached_tokens(req tokens) - n
  start_load_kv / wait_for_layer_load ->  conn.load(seq, tokens, kv_layers, slots)
                                          (or conn.load_layer per layer)
  save_kv_layer(layer, kv_layer, ...) ->  conn.save_layer(seq, layer, kv_layer, slots, pos)
  wait_for_save / request_finished    ->  conn.save(seq, tokens, kv_layers, slots) with the
                                          token ids (indexes full pages for other workers),
                                          conn.finish(seq)

LMCache's engine (store(tokens, kvcaches, slot_mapping) / retrieve(tokens,
kvcaches, slot_mapping) / lookup(tokens)) maps to save / load /
num_cached_tokens the same way.

Buffers may be NumPy arrays or torch tensors on any device; gathered tokens
are copied to the CPU once (a device tensor is moved with .cpu()) and put in
one request; loads scatter CPU data back with the buffer's own indexing.
"""
from __future__ import annotations

from typing import Sequence

from . import Cache, Client, Layout

__all__ = ["gather", "scatter", "KVConnector"]


def _split(kv_layer):
    """(K, V) of one layer's paged buffer, each [num_blocks, block_size, heads, dim]."""
    if isinstance(kv_layer, (tuple, list)):
        k, v = kv_layer
        return k, v
    if kv_layer.ndim != 5 or kv_layer.shape[1] != 2:
        raise ValueError("a layer's paged buffer is [num_blocks, 2, block_size, heads, dim] or "
                         f"a (K, V) pair; got shape {tuple(kv_layer.shape)}")
    return kv_layer[:, 0], kv_layer[:, 1]


def _index(slots, block_size):
    try:
        import torch
        if isinstance(slots, torch.Tensor):
            slots = slots.cpu().numpy()
    except ImportError:
        pass
    import numpy as np
    s = np.asarray(slots, dtype=np.int64)
    if s.ndim != 1 or (s < 0).any():
        raise ValueError("slot_mapping: a 1-D sequence of slots >= 0")
    return s // block_size, s % block_size


def _like(x, idx):
    """idx as x's index type (torch tensors want torch indices on their device)."""
    try:
        import torch
        if isinstance(x, torch.Tensor):
            return torch.from_numpy(idx).to(x.device)
    except ImportError:
        pass
    return idx


def _cpu_contig(t):
    if hasattr(t, "is_contiguous"):  # torch
        return t.cpu().contiguous()
    import numpy as np
    return np.ascontiguousarray(t)


def gather(kv_layers: Sequence, slot_mapping, layers: range | None = None):
    """K and V [len(layers), n, heads, dim] of the tokens at slot_mapping, ready
    for Cache.put (CPU, contiguous)."""
    layers = range(len(kv_layers)) if layers is None else layers
    ks, vs = [], []
    for l in layers:
        k, v = _split(kv_layers[l])
        b, o = _index(slot_mapping, k.shape[1])
        ks.append(k[_like(k, b), _like(k, o)])
        vs.append(v[_like(v, b), _like(v, o)])
    if hasattr(ks[0], "is_contiguous"):
        import torch
        return _cpu_contig(torch.stack(ks)), _cpu_contig(torch.stack(vs))
    import numpy as np
    return np.stack(ks), np.stack(vs)


def scatter(kv_layers: Sequence, slot_mapping, k, v, layers: range | None = None):
    """Writes K and V [len(layers), n, heads, dim] into the paged buffers at
    slot_mapping (the inverse of gather)."""
    layers = range(len(kv_layers)) if layers is None else layers
    for i, l in enumerate(layers):
        pk, pv = _split(kv_layers[l])
        b, o = _index(slot_mapping, pk.shape[1])
        pk[_like(pk, b), _like(pk, o)] = _to(pk, k[i])
        pv[_like(pv, b), _like(pv, o)] = _to(pv, v[i])


def _to(dst, src):
    """src (NumPy or torch, CPU) as dst's kind, dtype and device."""
    try:
        import torch
        if isinstance(dst, torch.Tensor):
            if not isinstance(src, torch.Tensor):
                from . import torch_view
                src = torch_view(src)
            return src.to(device=dst.device, dtype=dst.dtype)
    except ImportError:
        pass
    return src


class KVConnector:
    """One worker's view of a kvcached cache for an engine's paged KV buffers.

    client: a kvcache.Client of this worker's thread; name, layout: the cache
    (every worker of one model opens the same). A request is a sequence id
    chosen by the engine (e.g. a hash of its request id).
    """

    def __init__(self, client: Client, name: str, layout: Layout, salt: bytes = b""):
        self.cache: Cache = client.open_cache(name, layout, salt=salt)
        self.layout = self.cache.layout

    def num_cached_tokens(self, token_ids, span_keys=None) -> int:
        """How many leading tokens of token_ids kvcached holds (whole pages):
        vLLM's get_num_new_matched_tokens is this minus what it computed.
        span_keys: (begin, end, key) of the prompt's multimodal inputs (their
        content hashes over their placeholder tokens), as saved."""
        return self.cache.match(token_ids, span_keys=span_keys)["tokens"]

    def load(self, seq: int, token_ids, kv_layers: Sequence, slot_mapping, pin: bool = True,
             span_keys=None) -> int:
        """Attaches the cached prefix of token_ids as seq (pinned: it stays
        until finish) and scatters it into the paged buffers at
        slot_mapping[:matched]. Returns the tokens loaded."""
        n = self.cache.attach(seq, token_ids, pin=pin, span_keys=span_keys)["tokens"]
        if n:
            k, v = self.cache.get(seq, 0, n)
            scatter(kv_layers, slot_mapping[:n], k, v)
        return n

    def load_layer(self, seq: int, layer: int, kv_layer, slot_mapping, begin: int, end: int):
        """One layer of tokens [begin, end) of seq into kv_layer at slot_mapping
        (for layer-by-layer loading, wait_for_layer_load)."""
        k, v = self.cache.get(seq, begin, end, layers=(layer, layer + 1))
        scatter([kv_layer], slot_mapping, k, v)

    def save(self, seq: int, token_ids, kv_layers: Sequence, slot_mapping, pos: int = 0,
             span_keys=None):
        """Puts the tokens at slot_mapping (every layer) as seq's positions
        [pos, pos + n), with their ids: full pages enter the prefix cache for
        every worker. token_ids: the n ids of those tokens (or None);
        span_keys: (begin, end, key) extra keys of positions (a multimodal
        input's hash over its placeholder tokens)."""
        k, v = gather(kv_layers, slot_mapping)
        self.cache.put(seq, pos, k, v, tokens=token_ids, span_keys=span_keys)

    def save_layer(self, seq: int, layer: int, kv_layer, slot_mapping, pos: int,
                   token_ids=None, span_keys=None):
        """One layer's tokens at slot_mapping as seq's [pos, pos + n) (save_kv_layer:
        kvcached takes a layer range ahead of the others; the tokens count in
        the sequence's length once every layer holds them). With token_ids
        (the same ids for every layer), a page enters the prefix cache once
        every layer of it is saved."""
        k, v = gather([kv_layer], slot_mapping)
        self.cache.put(seq, pos, k, v, tokens=token_ids, layers=(layer, layer + 1),
                       span_keys=span_keys)

    def finish(self, seq: int, keep: bool = True):
        """The request is done: unpin seq (its pages stay cached, evictable, and
        matchable by their token ids), or drop it with keep=False."""
        try:
            self.cache.unpin(seq)
        except Exception as e:  # not pinned here: nothing to release
            from . import NotpinnedError, NoseqError
            if not isinstance(e, (NotpinnedError, NoseqError)):
                raise
        if not keep:
            self.cache.remove(seq)
