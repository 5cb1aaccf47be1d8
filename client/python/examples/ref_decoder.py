#!/usr/bin/python3
"""ref_decoder.py: a small decoder-only transformer whose KV cache lives in kvcached.

Read this in ten minutes to see what a worker does with kvcache:

  * the model (Model) is ordinary PyTorch: GQA attention (4 query heads share
    2 KV heads), NeoX RoPE, several layers, deterministic random weights.
    Its forward pass takes the past K/V of every layer and returns the new
    tokens' K/V: where the past comes from is the cache's business.
  * KvcachedCache keeps that past in kvcached: per step ONE request. With
    read="step" (the fast loop, doc/worker-guide.md) it is cache.step(
    writes=...): the step's new K/V of every layer and sequence written, and
    in the same round trip the leases of every sequence's history for the
    next step, read in place through block tables over the cache's arena.
    With read="lease" or "get": one batched put a step, and reads through a
    lease's per-page views or get.
  * TorchCache is PyTorch's own in-process cache (a tensor per layer), the
    reference the kvcached run must match.
  * generate() is prefill then greedy decode; context_shift() removes a
    middle range (the daemon re-rotates the later keys; TorchCache does the
    same rotation itself).
  * As a program: `ref_decoder.py --socket S --worker B` is a second worker
    process: it attaches the system prompt a first worker prefilled (no
    recompute of those pages), finishes its own prompt and decodes.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np
import torch

import kvcache

# ---- the model -------------------------------------------------------------

VOCAB, D_MODEL, N_HEADS, N_KV_HEADS, HEAD_DIM, N_LAYERS, D_FF = 100, 128, 4, 2, 32, 3, 256
THETA = 10000.0
TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "int8": torch.float32}


def rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """NeoX rotary embedding of x [tokens, heads, dim] at positions pos [tokens]."""
    half = x.shape[-1] // 2
    inv = THETA ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    ang = pos.to(torch.float64)[:, None] * inv[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    a, b = x[..., :half].double(), x[..., half:].double()
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1).to(x.dtype)


class Model:
    def __init__(self, seed: int = 1234):
        g = torch.Generator().manual_seed(seed)

        def w(*shape, scale=None):
            return torch.randn(*shape, generator=g) * (scale or 1 / math.sqrt(shape[0]))

        self.emb = w(VOCAB, D_MODEL, scale=1.0)
        self.layers = [dict(q=w(D_MODEL, N_HEADS * HEAD_DIM), k=w(D_MODEL, N_KV_HEADS * HEAD_DIM),
                            v=w(D_MODEL, N_KV_HEADS * HEAD_DIM), o=w(N_HEADS * HEAD_DIM, D_MODEL),
                            up=w(D_MODEL, D_FF), down=w(D_FF, D_MODEL))
                       for _ in range(N_LAYERS)]
        self.out = w(D_MODEL, VOCAB, scale=4 / math.sqrt(D_MODEL))  # well-separated logits

    @staticmethod
    def _norm(x):
        return x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()

    def forward(self, tokens, pos, past, kv_dtype):
        """One sequence's new tokens [n] at positions pos [n]; past[l] = (K, V)
        [t, kv_heads, dim] of layer l (t may be 0). Returns logits [n, vocab]
        and the new K/V per layer, rounded to the cache's dtype."""
        n = len(tokens)
        x = self.emb[tokens]
        new = []
        for lw, (pk, pv) in zip(self.layers, past):
            h = self._norm(x)
            q = rope((h @ lw["q"]).view(n, N_HEADS, HEAD_DIM), pos)
            k = rope((h @ lw["k"]).view(n, N_KV_HEADS, HEAD_DIM), pos).to(kv_dtype)
            v = (h @ lw["v"]).view(n, N_KV_HEADS, HEAD_DIM).to(kv_dtype)
            new.append((k, v))
            K = torch.cat([pk.to(kv_dtype), k]).float()
            V = torch.cat([pv.to(kv_dtype), v]).float()
            t = K.shape[0]
            grp = N_HEADS // N_KV_HEADS  # GQA: query head i reads KV head i // grp
            K = K.repeat_interleave(grp, 1)
            V = V.repeat_interleave(grp, 1)
            s = torch.einsum("nhd,thd->hnt", q, K) / math.sqrt(HEAD_DIM)
            causal = torch.arange(t)[None, :] > (t - n + torch.arange(n))[:, None]
            s = s.masked_fill(causal[None], float("-inf"))
            a = torch.einsum("hnt,thd->nhd", s.softmax(-1), V).reshape(n, -1)
            x = x + a @ lw["o"]
            x = x + torch.relu(self._norm(x) @ lw["up"]) @ lw["down"]
        return self._norm(x) @ self.out, new


# ---- the caches ------------------------------------------------------------

class TorchCache:
    """PyTorch's in-process cache: per sequence, per layer, K and V tensors."""

    def __init__(self, dtype):
        self.dtype, self.tdtype = dtype, TORCH_DTYPES[dtype]
        self.seqs = {}

    def past(self, seq):
        empty = torch.zeros(0, N_KV_HEADS, HEAD_DIM, dtype=self.tdtype)
        return self.seqs.get(seq, [(empty, empty)] * N_LAYERS)

    def append(self, step):  # step: {seq: [(k, v)] per layer}
        for seq, new in step.items():
            self.seqs[seq] = [(torch.cat([pk, k]), torch.cat([pv, v]))
                              for (pk, pv), (k, v) in zip(self.past(seq), new)]

    def remove_middle(self, seq, a, b):
        """What kvcached's remove does: drop [a, b), move later keys down."""
        out = []
        for K, V in self.seqs[seq]:
            tail = rope(K[b:].float(), torch.full((K.shape[0] - b,), float(a - b))).to(K.dtype)
            out.append((torch.cat([K[:a], tail]), torch.cat([V[:a], V[b:]])))
        self.seqs[seq] = out


class KvcachedCache:
    """The same cache in kvcached: one put_batch per step, reads by lease or get."""

    def __init__(self, cache: kvcache.Cache, dtype: str, read: str = "lease"):
        self.cache, self.dtype, self.read = cache, dtype, read
        self.tdtype = TORCH_DTYPES[dtype]
        self.lengths = {}
        self.view = None  # read="step": the last step's StepView (leases held)
        self.rows = {}    # seq: its row of the view's block tables

    def past(self, seq):
        n = self.lengths.get(seq, 0)
        empty = torch.zeros(0, N_KV_HEADS, HEAD_DIM, dtype=self.tdtype)
        if n == 0:
            return [(empty, empty)] * N_LAYERS
        if seq in self.rows:  # read="step": in place, through the block table
            v, i = self.view, self.rows[seq]
            a = v.arena.torch()
            pages = torch.from_numpy(v.block_tables[i]).long()
            s, e = int(v.starts[i]), int(v.ends[i])
            assert e == n, f"the step leased {e} tokens of seq {seq}, it has {n}"
            # [pages, layer, page_tokens, head, dim] -> per layer [tokens, head, dim]
            k, v_ = a.k[pages], a.v[pages]
            return [(k[:, l].reshape(-1, N_KV_HEADS, HEAD_DIM)[s:e],
                     v_[:, l].reshape(-1, N_KV_HEADS, HEAD_DIM)[s:e]) for l in range(N_LAYERS)]
        if self.read in ("lease", "step") and self.dtype != "int8":
            with self.cache.lease(seq, 0, n) as lease:  # zero-copy views, copied once here
                return [(self._cat(lease.k(l)), self._cat(lease.v(l))) for l in range(N_LAYERS)]
        k, v = self.cache.get(seq, 0, n)  # [layer, token, head, dim]; int8: dequantized f32
        k, v = kvcache.torch_view(k), kvcache.torch_view(v)
        return [(k[l], v[l]) for l in range(N_LAYERS)]

    def _cat(self, views):
        return kvcache.torch_view(np.concatenate(views))

    def append(self, step, tokens=None):
        entries = []
        for seq, new in step.items():
            k = torch.stack([k for k, _ in new]).contiguous()  # [layer, n, head, dim]
            v = torch.stack([v for _, v in new]).contiguous()
            e = (seq, self.lengths.get(seq, 0), k, v)
            entries.append(e + ((tokens[seq],) if tokens and seq in tokens else ()))
        if self.read == "step":
            # Write step t and lease step t+1's history in one round trip; the
            # previous step's leases go with this request (release_later).
            for le in self.view.leases if self.view else ():
                le.release_later()
            one = all(e[2].shape[1] == 1 for e in entries)
            self.view = self.cache.step(writes=[kvcache.StepWrite(*e) for e in entries],
                                        view="lease", no_mask=one)
            self.rows = {sp[0]: i for i, sp in enumerate(self.view.spans)}
        else:
            self.cache.put_batch(entries)  # the whole step: one request
        for seq, new in step.items():
            self.lengths[seq] = self.lengths.get(seq, 0) + new[0][0].shape[0]

    def remove_middle(self, seq, a, b):
        self.rows.pop(seq, None)  # its leased history is the old one
        self.cache.remove(seq, a, b)  # the daemon re-rotates the moved keys
        self.lengths[seq] -= b - a


# ---- generation ------------------------------------------------------------

def step(model, cache, batch, tokens=None):
    """One forward pass over batch {seq: (token ids, first position)}; returns
    {seq: logits} and appends the new K/V to the cache."""
    logits, new = {}, {}
    for seq, (ids, p0) in batch.items():
        pos = torch.arange(p0, p0 + len(ids))
        logits[seq], new[seq] = model.forward(torch.tensor(ids), pos, cache.past(seq),
                                              cache.tdtype)
    cache.append(new, tokens) if tokens else cache.append(new)
    return logits


def generate(model, cache, prompts, steps, start=None, tokens_for_index=False, pos=None):
    """Prefill prompts {seq: ids} (from start[seq], 0 by default), then greedy
    decode. Returns ({seq: generated ids}, [logits of every step]). pos: the
    prompts' first positions when the cache already holds tokens before them
    (after a context shift)."""
    start = start or {}
    p0 = {s: (pos or {}).get(s, start.get(s, 0)) for s in prompts}
    batch = {s: (ids[start.get(s, 0):], p0[s]) for s, ids in prompts.items()}
    idx = {s: ids for s, ids in prompts.items()} if tokens_for_index else None
    out, trace = {s: [] for s in prompts}, []
    pos = {s: p0[s] + len(ids) - start.get(s, 0) for s, ids in prompts.items()}
    for _ in range(steps):
        lg = step(model, cache, batch, idx)
        idx = None
        trace.append({s: l[-1] for s, l in lg.items()})
        batch = {}
        for s, l in lg.items():
            t = int(l[-1].argmax())
            out[s].append(t)
            batch[s] = ([t], pos[s])
            pos[s] += 1
    return out, trace


def layout(dtype):
    return kvcache.Layout(N_LAYERS, N_KV_HEADS, HEAD_DIM, dtype, page_tokens=16,
                          rope_dims=HEAD_DIM, rope_style="neox", rope_theta=THETA)


SYSTEM = [(7 * i + 3) % VOCAB for i in range(32)]  # a 32-token system prompt: 2 pages


def worker_b(socket_path, dtype, steps):
    """The second worker: attach the system prompt, prefill the rest, decode."""
    model = Model()
    prompt = SYSTEM + [11, 12, 13, 14, 15]
    with kvcache.Client(socket=socket_path, timeout=30) as c:
        kc = KvcachedCache(c.open_cache("ref-" + dtype, layout(dtype)), dtype)
        m = kc.cache.attach(200, prompt, pin=True)  # shares the pages: no recompute
        kc.lengths[200] = m["tokens"]
        ids, trace = generate(model, kc, {200: prompt}, steps, start={200: m["tokens"]})
        return {"matched": m["tokens"], "ids": ids[200],
                "logits": [t[200].tolist() for t in trace]}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--dtype", default="f32", choices=sorted(TORCH_DTYPES))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--worker", default="B", choices=["B"])
    a = ap.parse_args()
    json.dump(worker_b(a.socket, a.dtype, a.steps), sys.stdout)
