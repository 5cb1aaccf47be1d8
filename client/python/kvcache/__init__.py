"""kvcache: the Python client of kvcached, the node-local KV-cache daemon.

A C extension over libkvcache (no ctypes): tensors go in and out through the
buffer protocol (NumPy arrays, memoryview) or as contiguous CPU torch tensors
(bfloat16 and float16 included), read and written in place.

    import kvcache, numpy as np
    layout = kvcache.Layout(num_layers=2, num_kv_heads=2, head_dim=32, dtype="f32")
    with kvcache.Client() as c:
        cache = c.open_cache("demo", layout)
        k = np.ones((2, 5, 2, 32), np.float32)       # [layer, token, head, dim]
        cache.put(seq=1, pos=0, k=k, v=k)
        k2, v2 = cache.get(1, 0, 5)

Every KVC_E_* code is an exception class under kvcache.Error (FullError,
NoseqError, ...), generated from the C library's X-macro list.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

from . import _kvcache
from ._kvcache import Error, LIBRARY_VERSION, PROTOCOL_VERSION  # noqa: F401

__all__ = ["Client", "Cache", "Lease", "Layout", "Error", "errors", "DTYPES", "torch_view",
           "Arena", "StepWrite", "StepView", "PutEntry", "GetEntry", "ShmEntry"]

# One class per KVC_E_* code: kvcache.FullError, kvcache.NoseqError, ...
errors = _kvcache._errors()  # {code: class}
for _cls in errors.values():
    globals()[_cls.__name__] = _cls
    __all__.append(_cls.__name__)
del _cls

DTYPES = {"f32": 1, "f64": 2, "f16": 3, "bf16": 4, "int8": 5, "fp8_e4m3": 6, "fp8_e5m2": 7,
          "q8_0": 8, "q4_0": 9}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
_ALIASES = {"float32": "f32", "float64": "f64", "float16": "f16", "half": "f16",
            "bfloat16": "bf16", "float": "f32", "double": "f64",
            "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}
ATTN = {"causal": 0, "window": 1, "chunked": 2, "encoder": 3}
ROPE = {"neox": 0, "gptj": 1, "none": 2}
ROPE_SCALING = {"linear": 0, "llama3": 1, "yarn": 2}


def _dtype_code(d) -> int:
    if isinstance(d, int):
        if d in _DTYPE_NAMES:
            return d
    else:
        s = str(d).rsplit(".", 1)[-1].replace("<class '", "").rstrip("'>")
        s = _ALIASES.get(s, s)
        if s in DTYPES:
            return DTYPES[s]
    raise ValueError(f"dtype must be one of {sorted(DTYPES)}, numpy's or torch's float "
                     f"dtypes, got {d!r}")


class Layout:
    """The layout of a cache (kvc_layout_t).

    num_layers, num_kv_heads, head_dim (K; head_dim_v defaults to it), dtype
    ('f32', 'f64', 'f16', 'bf16', 'int8', 'fp8_e4m3', 'fp8_e5m2', 'q8_0', 'q4_0'
    (ggml's blocks: head dims multiples of 32), or a NumPy/torch dtype:
    torch.float8_e4m3fn, torch.float8_e5m2), page_tokens
    (a power of two). attn: 'causal', 'window' (window, memory), 'chunked'
    (chunk) or 'encoder'. rope_dims > 0 describes the keys' RoPE (rope_style
    'neox' or 'gptj', rope_theta, rope_scale): the daemon then re-rotates keys
    when a middle range is removed or positions are shifted; rope_scaling
    'llama3' or 'yarn' (rope_scale the factor, rope_lo/rope_hi the low/high
    frequency factors or YaRN's beta_slow/beta_fast, rope_orig_ctx the
    original context) describes frequency-scaled RoPE. rope_style='none'
    (with rope_dims 0) declares keys without positions (NoPE, ALiBi): they move
    as they are.
    """

    __slots__ = ("num_layers", "num_kv_heads", "head_dim", "head_dim_v", "dtype",
                 "page_tokens", "attn", "window", "memory", "chunk", "rope_dims",
                 "rope_style", "rope_theta", "rope_scale", "rope_scaling", "rope_lo", "rope_hi",
                 "rope_orig_ctx")

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype="bf16", *,
                 head_dim_v: int | None = None, page_tokens: int = 16, attn: str = "causal",
                 window: int = 0, memory: int = 0, chunk: int = 0, rope_dims: int = 0,
                 rope_style: str = "neox", rope_theta: float = 10000.0,
                 rope_scale: float = 0.0, rope_scaling: str = "linear", rope_lo: float = 0.0,
                 rope_hi: float = 0.0, rope_orig_ctx: int = 0):
        self.num_layers = int(num_layers)
        self.num_kv_heads = int(num_kv_heads)
        self.head_dim = int(head_dim)
        self.head_dim_v = int(head_dim if head_dim_v is None else head_dim_v)
        self.dtype = _DTYPE_NAMES[_dtype_code(dtype)]
        self.page_tokens = int(page_tokens)
        if attn not in ATTN:
            raise ValueError(f"attn must be one of {sorted(ATTN)}, got {attn!r}")
        if rope_style not in ROPE:
            raise ValueError(f"rope_style must be one of {sorted(ROPE)}, got {rope_style!r}")
        self.attn, self.rope_style = attn, rope_style
        self.window, self.memory, self.chunk = int(window), int(memory), int(chunk)
        self.rope_dims = int(rope_dims)
        self.rope_theta, self.rope_scale = float(rope_theta), float(rope_scale)
        if rope_scaling not in ROPE_SCALING:
            raise ValueError(f"rope_scaling must be one of {sorted(ROPE_SCALING)}, "
                             f"got {rope_scaling!r}")
        self.rope_scaling = rope_scaling
        self.rope_lo, self.rope_hi = float(rope_lo), float(rope_hi)
        self.rope_orig_ctx = int(rope_orig_ctx)

    def _astuple(self):
        rope = self.rope_dims > 0  # without RoPE every rope field is 0
        return (self.num_layers, self.num_kv_heads, self.head_dim, self.head_dim_v,
                DTYPES[self.dtype], self.page_tokens, ATTN[self.attn], self.window, self.memory,
                self.chunk, self.rope_dims,
                ROPE[self.rope_style] if rope or self.rope_style == "none" else 0,
                self.rope_theta if rope else 0.0, self.rope_scale if rope else 0.0,
                ROPE_SCALING[self.rope_scaling] if rope else 0, self.rope_lo if rope else 0.0,
                self.rope_hi if rope else 0.0, self.rope_orig_ctx if rope else 0)

    @classmethod
    def _fromtuple(cls, t):
        inv_attn = {v: k for k, v in ATTN.items()}
        inv_rope = {v: k for k, v in ROPE.items()}
        return cls(t[0], t[1], t[2], _DTYPE_NAMES[t[4]], head_dim_v=t[3], page_tokens=t[5],
                   attn=inv_attn[t[6]], window=t[7], memory=t[8], chunk=t[9], rope_dims=t[10],
                   rope_style=inv_rope[t[11]], rope_theta=t[12] or 10000.0, rope_scale=t[13],
                   rope_scaling={v: k for k, v in ROPE_SCALING.items()}[t[14]], rope_lo=t[15],
                   rope_hi=t[16], rope_orig_ctx=t[17])

    def __eq__(self, other):
        return isinstance(other, Layout) and self._astuple() == other._astuple()

    def __repr__(self):
        f = ", ".join(f"{s}={getattr(self, s)!r}" for s in self.__slots__)
        return f"Layout({f})"


class Client(_kvcache.Client):
    __doc__ = _kvcache.Client.__doc__

    def shm_array(self, shape, dtype="bf16"):
        """A new NumPy array inside the shared buffer (zeros not promised).

        A put of it, or a get (out=) or step write into it, moves its bytes
        by their offset: no copy in the client, the one copy is the daemon's
        into (or out of) the pool. Its block is taken from the buffer's top
        and freed when the last array or tensor over it goes; the library's
        own copies (puts of other tensors, history, match) stay below the
        lowest block. dtype: a cache dtype name (bf16 as uint16 bits, fp8 /
        q8_0 / q4_0 as uint8 bytes) or a NumPy dtype. MemoryError when no
        free run is large enough. Once the client closes it reads zeros.
        """
        np = _np()
        dt = np.dtype(_NP_DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
        n = dt.itemsize
        for d in shape:
            if d < 0:
                raise ValueError(f"shm_array: a negative dimension in {shape}")
            n *= d
        blk = self._shm_alloc(max(n, 1), 4096 if n >= 65536 else 256)
        return np.frombuffer(blk, dt, count=n // dt.itemsize).reshape(shape)

    def shm_tensor(self, shape, dtype="bf16"):
        """A new CPU torch tensor inside the shared buffer: shm_array's
        bytes (see there) as torch's dtype (bf16: torch.bfloat16, fp8:
        torch.float8_*). dtype: a cache dtype name or a torch dtype."""
        import torch
        name = str(dtype).rsplit(".", 1)[-1]
        name = _ALIASES.get(name, name)
        tdt = getattr(torch, _TORCH_DTYPES.get(name, name), None)
        if not isinstance(tdt, torch.dtype):
            raise ValueError(f"shm_tensor: no torch dtype for {dtype!r}")
        shape = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
        n = torch.empty((), dtype=tdt).element_size()
        for d in shape:
            if d < 0:
                raise ValueError(f"shm_tensor: a negative dimension in {shape}")
            n *= d
        blk = self._shm_alloc(max(n, 1), 4096 if n >= 65536 else 256)
        return torch.frombuffer(blk, dtype=torch.uint8, count=max(n, 1))[:n].view(tdt).view(shape)

    @property
    def shm_blocks(self):
        """[(offset, bytes)] of the shared buffer's live blocks (shm_array,
        shm_tensor), lowest first; the library's part is below the first."""
        return self._shm_blocks()


_TORCH_DTYPES = {"f32": "float32", "f64": "float64", "f16": "float16", "bf16": "bfloat16",
                 "int8": "int8", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2",
                 "q8_0": "uint8", "q4_0": "uint8", "uint8": "uint8", "int32": "int32",
                 "int64": "int64"}


def _np():
    import numpy
    return numpy


_NP_DTYPES = {"f32": "float32", "f64": "float64", "f16": "float16", "bf16": "uint16",
              "int8": "int8", "fp8_e4m3": "uint8", "fp8_e5m2": "uint8", "q8_0": "uint8",
              "q4_0": "uint8"}
_BLOCK_BYTES = {"q8_0": 34, "q4_0": 18}  # a block of 32 values


def _row_dim(dname, dim):
    """A head row's last dimension: dim values, or for q8_0 / q4_0 its blocks' bytes."""
    bb = _BLOCK_BYTES.get(dname)
    return dim // 32 * bb if bb else dim


class StepWrite(NamedTuple):
    """One sequence's new tokens in a step (Cache.step(writes=...)): k and v
    are [layer, token, head, dim] tensors (CPU torch or NumPy, any dtype a
    put takes), tokens their ids (None: unknown)."""
    seq: int
    pos: int
    k: Any
    v: Any
    tokens: Optional[Any] = None


class PutEntry(NamedTuple):
    """One entry of put_batch: tokens [pos, pos + n) of seq from k and v
    ([layer, token, head, dim]), with their ids if known."""
    seq: int
    pos: int
    k: Any
    v: Any
    tokens: Optional[Any] = None


class GetEntry(NamedTuple):
    """One entry of get_batch: tokens [pos, pos + n) of seq, into out_k and
    out_v when given (else new arrays)."""
    seq: int
    pos: int
    n: int
    out_k: Optional[Any] = None
    out_v: Optional[Any] = None


class ShmEntry(NamedTuple):
    """One entry of put_shm, get_shm and step(entries): tokens [pos, pos + n)
    of seq, K and V at byte offsets of client.shm (lengths 0: as the layout
    requires; token ids, u32, at tok_off for a put)."""
    seq: int
    pos: int
    n: int
    k_off: int
    v_off: int
    k_len: int = 0
    v_len: int = 0
    k_scale_off: int = 0
    v_scale_off: int = 0
    tok_off: int = 0
    tok_len: int = 0


class StepView(NamedTuple):
    """What Cache.step(writes=...) returns for a view (see there)."""
    leases: list            # a Lease per sequence (view="lease"), else []
    spans: list             # (seq, pos, first, n) per sequence
    mask: Any               # f32 [tokens, entries] or None (no_mask)
    block_tables: Any       # int32 [sequences, max pages]: pages of arena (0 past the end)
    starts: Any             # int32 [sequences]: the first leased row in page 0
    ends: Any               # int32 [sequences]: rows from page 0's first to the end
    arena: Any              # the cache's Arena (view="lease" on a daemon of arenas)
    k: Any = None           # view="gather": K [layers, entries, heads, dim]
    v: Any = None
    positions: Any = None   # positions=True: each entry's position


class Arena:
    """A cache's arena as one array of pages, read in place (read-only).

    A daemon of arenas keeps each cache's pages in an arena of its tenant
    and page size; the client maps the arena as one array, and a lease's
    block_table (a step's block_tables) lists its pages' indices in it: what
    a paged-attention kernel takes (vLLM's and FlashInfer's convention).

    k, v: NumPy arrays [num_pages, layers, page_tokens, heads, head_dim] in
    the cache's dtype (bf16 as uint16 bits, fp8 / q8_0 / q4_0 bytes as
    uint8, the last dimension a head row's bytes); kv: [num_pages, layers, 2,
    page_tokens, heads, head_dim] (K then V of each layer; None when K and V
    rows differ in size); k_scale, v_scale: int8 caches' f32 scales
    [num_pages, layers, page_tokens, heads]. torch() gives the same as torch
    tensors (bf16 as torch.bfloat16), views of the same memory.

    A page is valid while a lease holds it: index with the block tables of
    leases you hold. Pages of other arenas, and the whole arena once the
    client closes, read as zeros; nothing here is writable (a write through
    a torch tensor is a segmentation fault, as for any read-only mapping).
    """

    def __init__(self, cache, raw):
        np = _np()
        (region, stride, npages, layer_bytes, v_off, k_row, v_row, ks_off, vs_off,
         pt) = raw
        lay = cache._layout
        self.dtype = _DTYPE_NAMES[lay[4]]
        self.region = region
        self.num_pages, self.page_stride, self.page_tokens = npages, stride, pt
        dt = np.dtype(_NP_DTYPES[self.dtype])
        isz = dt.itemsize
        nl, heads = lay[0], lay[1]
        kd, vd = _row_dim(self.dtype, lay[2]), _row_dim(self.dtype, lay[3])
        buf = memoryview(region)
        self.k = np.ndarray((npages, nl, pt, heads, kd), dt, buf, 0,
                            (stride, layer_bytes, k_row, kd * isz, isz))
        self.v = np.ndarray((npages, nl, pt, heads, vd), dt, buf, v_off,
                            (stride, layer_bytes, v_row, vd * isz, isz))
        self.kv = None
        if kd == vd and k_row == v_row:
            self.kv = np.ndarray((npages, nl, 2, pt, heads, kd), dt, buf, 0,
                                 (stride, layer_bytes, v_off, k_row, kd * isz, isz))
        self.k_scale = self.v_scale = None
        if self.dtype == "int8":
            f4 = np.dtype("float32")
            self.k_scale = np.ndarray((npages, nl, pt, heads), f4, buf, ks_off,
                                      (stride, layer_bytes, heads * 4, 4))
            self.v_scale = np.ndarray((npages, nl, pt, heads), f4, buf, vs_off,
                                      (stride, layer_bytes, heads * 4, 4))
        self._torch = None

    @property
    def alive(self) -> bool:
        """False once the client is closed (every page reads zeros)."""
        return self.region.alive

    def torch(self):
        """The arrays as torch tensors (the same memory): an object with k,
        v, kv, k_scale, v_scale. bf16 is torch.bfloat16, fp8 torch's float8
        types where the installed torch has them."""
        if self._torch is None:
            import types
            import warnings
            with warnings.catch_warnings():  # read-only memory, as the class says
                warnings.simplefilter("ignore", UserWarning)
                self._torch = types.SimpleNamespace(**{
                    n: (torch_view(a, self.dtype) if a is not None else None)
                    for n, a in (("k", self.k), ("v", self.v), ("kv", self.kv),
                                 ("k_scale", self.k_scale), ("v_scale", self.v_scale))})
        return self._torch

    def __repr__(self):
        return (f"Arena({self.num_pages} pages of {self.page_tokens} tokens, {self.dtype}, "
                f"stride {self.page_stride} bytes{'' if self.alive else ', closed'})")


def _arena_of(cache, lease):
    raw = lease._arena()
    if raw is None:
        return None
    a = cache.__dict__.get("_arena_obj")
    if a is None or a.region is not raw[0]:
        a = Arena(cache, raw)
        cache.__dict__["_arena_obj"] = a
    return a


class Cache(_kvcache.Cache):
    __doc__ = _kvcache.Cache.__doc__ + """

    Tensors are [layer, token, head, dim], C-contiguous; a non-contiguous
    input raises ValueError (kvcache never copies behind your back: pass
    numpy.ascontiguousarray(x) or x.contiguous()). bf16 comes back from
    NumPy-returning calls as uint16 bits (kvcache.torch_view makes it a
    torch.bfloat16 tensor without a copy), or pass out= torch tensors. fp8
    codes come back as uint8 (torch_view(a, 'fp8_e4m3') makes them
    torch.float8_e4m3fn); an fp8 cache takes its codes as uint8 arrays or
    torch float8 tensors, and f32 / f16 / bf16 converted. q8_0 / q4_0 caches
    take and return their blocks as uint8 arrays whose last dimension is a
    head row's bytes (head_dim / 32 blocks of 34 or 18 bytes), or f32 / f16 /
    bf16 values converted.
    """

    @property
    def layout(self) -> Layout:
        """The cache's Layout (page_tokens filled in)."""
        return Layout._fromtuple(self._layout)

    def history(self, toks, dtype=None, layers=None, copy=True, positions=False):
        """The history the batch toks attends to: (K, V, mask, spans).

        toks: a sequence of (seq, pos) (or an [n, 2] int64 array), the tokens
        of a forward pass just put. K is [layers, entries, heads, head_dim]
        (V likewise) in the cache's float dtype or f32 (int8 caches: f32;
        bf16 as uint16 bits), gathered in position order per sequence; mask
        is f32 [len(toks), entries] (0 attend, -inf masked) for the cache's
        attention kind; spans lists (seq, pos, first, n) per sequence (pos:
        its first slot). With copy=False the arrays are views of client.shm,
        valid until the client's next call. With positions=True a fifth
        element: each entry's position (int64 array), which after seq_div
        differs from its slot (the mask goes by positions).
        """
        (entries, k_off, k_bytes, v_off, v_bytes, m_off, m_bytes, dname,
         spans, pos) = self._history(toks, dtype=dtype, layers=layers)
        np = _np()
        lay = self._layout
        nl = (layers[1] - layers[0]) if layers else lay[0]
        shm = self.client.shm
        dt = np.dtype(_NP_DTYPES[dname])

        def arr(off, nbytes, shape, d):
            a = np.frombuffer(shm, d, count=nbytes // d.itemsize, offset=off).reshape(shape)
            return a.copy() if copy else a

        k = arr(k_off, k_bytes, (nl, entries, lay[1], _row_dim(dname, lay[2])), dt)
        v = arr(v_off, v_bytes, (nl, entries, lay[1], _row_dim(dname, lay[3])), dt)
        n = m_bytes // 4 // entries if entries else 0
        mask = arr(m_off, m_bytes, (n, entries), np.dtype("float32"))
        if positions:
            return k, v, mask, spans, _entry_positions(entries, spans, pos)
        return k, v, mask, spans

    def arena(self):
        """The cache's Arena (its pages as one array), known from the
        client's first lease or step on it; None before (or without arenas:
        a daemon run with page_bytes)."""
        return self.__dict__.get("_arena_obj")

    def block_tables(self, leases):
        """(tables, starts, ends) of leases of this cache, as int32 NumPy
        arrays: tables [len(leases), max pages] (each lease's block_table,
        0 past its pages), starts (the lease's first row in its page 0),
        ends (rows from page 0's first to the lease's end: a kernel's
        sequence length). torch.from_numpy makes tensors of them, no copy."""
        return self._block_tables(leases)

    def step(self, entries=None, view="lease", out=None, no_mask=False, dtype=None, layers=None,
             copy=False, positions=False, *, writes=None):
        """One decode (or prefill) step in one round trip, all or nothing.

        With writes (a sequence of StepWrite(seq, pos, k, v, tokens=None),
        torch tensors or NumPy arrays as put takes): each tensor made with
        client.shm_tensor goes by its offset (no copy here), any other is
        copied into the shared buffer in C with the GIL released, then the
        one request. Returns a StepView: for view="lease" a Lease per
        sequence plus the batch's block_tables, starts and ends over the
        cache's arena (read the history in place: arena.k[block_tables[i],
        layer], or pass them to a paged-attention kernel); for
        view="gather" k and v gathered into the shared buffer (views,
        valid until the client's next call; copy=True copies them); None
        for view=None. no_mask=True (a lease view) skips the mask: a step
        of one token a sequence needs none (that token attends to its whole
        span); with several tokens a sequence (a prefill chunk) the kernel
        must then mask causally itself (flash-attn's causal=True).

        entries: as put_shm's, (seq, pos, n, k_off, v_off, ...), the batch's
        new K/V already in client.shm. Writes them, then returns the history
        view the batch (every entry's tokens) attends to:
        - view="lease": (leases, mask, spans): a Lease per sequence (spans[i]
          is leases[i]'s (seq, pos, first, n)), read in place; mask as
          history's, or None with no_mask=True (one token a sequence);
        - view="gather": (K, V, mask, spans) as history returns them;
        - view=None: None (the put alone).
        out: (offset, length) of client.shm where the view lands; default
        from the end of the last entry's region to the end of the buffer.
        With copy=False (the default) gathered arrays are views of
        client.shm, valid until the client's next call. With positions=True
        the tuple ends with each entry's position (as history's).
        """
        views = {None: 0, "none": 0, "lease": 1, "gather": 2}
        if view not in views:
            raise ValueError("view: None, 'lease' or 'gather'")
        if writes is not None:
            if entries is not None or out is not None or dtype is not None:
                raise ValueError("step: writes= goes without entries, out and dtype (the "
                                 "tensors' dtype is the write's; the view lands after the "
                                 "copies)")
            return self._step_writes(writes, views[view], no_mask, layers, copy, positions)
        if entries is None:
            raise ValueError("step: entries (offsets into client.shm) or writes (tensors)")
        if out is None:
            end = 0
            for e in entries:
                kb, vb, _ = self.xfer_bytes(e[2], put=True, dtype=dtype, layers=layers)
                end = max(end, e[3] + (e[5] if len(e) > 5 and e[5] else kb),
                          e[4] + (e[6] if len(e) > 6 and e[6] else vb))
            off = (end + 63) // 64 * 64
            out = (off, max(len(self.client.shm) - off, 0))
        raw = self._step(entries, view=views[view], out_off=out[0], out_len=out[1],
                         no_mask=no_mask, dtype=dtype, layers=layers)
        if raw is None:
            return None
        (n_entries, k_off, k_bytes, v_off, v_bytes, m_off, m_bytes, dname, spans,
         leases, pos, _tables) = raw
        if leases and _tables is not None:
            _arena_of(self, leases[0])
        extra = (_entry_positions(n_entries, spans, pos),) if positions else ()
        np = _np()
        shm = self.client.shm

        def arr(off, nbytes, shape, d):
            a = np.frombuffer(shm, d, count=nbytes // d.itemsize, offset=off).reshape(shape)
            return a.copy() if copy else a

        ntok = m_bytes // 4 // n_entries if n_entries else 0
        mask = arr(m_off, m_bytes, (ntok, n_entries), np.dtype("float32")) if m_bytes else None
        if view == "lease":
            return (leases, mask, spans) + extra
        lay = self._layout
        nl = (layers[1] - layers[0]) if layers else lay[0]
        dt = np.dtype(_NP_DTYPES[dname])
        k = arr(k_off, k_bytes, (nl, n_entries, lay[1], _row_dim(dname, lay[2])), dt)
        v = arr(v_off, v_bytes, (nl, n_entries, lay[1], _row_dim(dname, lay[3])), dt)
        return (k, v, mask, spans) + extra


def _step_writes(self, writes, view, no_mask, layers, copy, positions):
    raw = self._step_io(writes, view=view, no_mask=no_mask, layers=layers)
    if raw is None:
        return None
    (n_entries, k_off, k_bytes, v_off, v_bytes, m_off, m_bytes, dname, spans, leases, pos,
     tables) = raw
    np = _np()

    def arr(off, nbytes, shape, d):
        a = np.frombuffer(self.client.shm, d, count=nbytes // d.itemsize,
                          offset=off).reshape(shape)
        return a.copy() if copy else a

    mask = None
    if m_bytes:
        ntok = m_bytes // 4 // n_entries if n_entries else 0
        mask = arr(m_off, m_bytes, (ntok, n_entries), np.dtype("float32"))
    p = _entry_positions(n_entries, spans, pos) if positions else None
    bt, st, en = tables if tables is not None else (None, None, None)
    arena = _arena_of(self, leases[0]) if leases and tables is not None else None
    k = v = None
    if view == 2:
        lay = self._layout
        nl = (layers[1] - layers[0]) if layers else lay[0]
        dt = np.dtype(_NP_DTYPES[dname])
        k = arr(k_off, k_bytes, (nl, n_entries, lay[1], _row_dim(dname, lay[2])), dt)
        v = arr(v_off, v_bytes, (nl, n_entries, lay[1], _row_dim(dname, lay[3])), dt)
    return StepView(leases, spans, mask, bt, st, en, arena, k, v, p)


Cache._step_writes = _step_writes


def _entry_positions(entries, spans, raw):
    """Each entry's position: the reply's, or each span's slots."""
    np = _np()
    if raw is not None:
        return np.frombuffer(raw, np.int64).copy()
    out = np.empty(entries, np.int64)
    for (_seq, pos, first, n) in spans:
        out[first:first + n] = np.arange(pos, pos + n, dtype=np.int64)
    return out


class Lease(_kvcache.Lease):
    """A zero-copy read lease (Cache.lease(seq, begin, end)); a context manager.

        with cache.lease(seq, 0, n) as lease:
            for k_page in lease.k(layer):     # read-only views of pool pages
                ...

    k(layer) / v(layer) return one read-only NumPy view per page, [tokens of
    the lease in that page, heads, head_dim] in the cache's dtype (bf16 as
    uint16 bits, int8 as the stored bytes; scales(layer) gives their f32
    scales). They read the daemon's pages in place: nothing is copied. Once
    the with block exits (or release()), the lease is released and every view
    reads zeros: invalid, never dangling. Keep a copy (numpy.array(view)) to
    use the data later.
    """

    def _views(self, layer: int, v: bool, scales: bool = False):
        np = _np()
        g = self._geometry()
        lay = self.cache._layout
        if not 0 <= layer < lay[0]:
            raise ValueError(f"layer {layer} outside the cache's {lay[0]} layers")
        heads, dim = lay[1], lay[3] if v else lay[2]
        if not scales:  # ggml blocks: a head row is its blocks' bytes
            dim = _row_dim(_DTYPE_NAMES[lay[4]], dim)
        if scales:
            dt, row, base, shape = (np.dtype("float32"), heads * 4,
                                    g["v_scale_offset" if v else "k_scale_offset"], (heads,))
        else:
            dt = np.dtype(_NP_DTYPES[_DTYPE_NAMES[lay[4]]])
            row = g["v_row_bytes" if v else "k_row_bytes"]
            base, shape = (g["v_offset"] if v else 0), (heads, dim)
        pt, first = g["page_tokens"], g["first_pos"]
        out = []
        region = memoryview(g["region"])
        for i, off in enumerate(g["page_offsets"]):
            p0 = max(g["begin"], first + i * pt)
            p1 = min(g["end"], first + (i + 1) * pt)
            if p1 <= p0:
                continue
            r0 = p0 - first - i * pt
            start = off + layer * g["layer_bytes"] + base + r0 * row
            strides = (row, 4) if scales else (row, dim * dt.itemsize, dt.itemsize)
            a = np.ndarray((p1 - p0,) + shape, dt, region, start, strides)
            out.append(a)
        return out

    @property
    def arena(self):
        """The cache's Arena (one array of pages) this lease's block_table
        indexes; None without arenas (a daemon run with page_bytes)."""
        return _arena_of(self.cache, self)

    def k(self, layer: int):
        """Read-only views of layer's K, one per page: [tokens, heads, head_dim]."""
        return self._views(layer, False)

    def v(self, layer: int):
        """Read-only views of layer's V, one per page."""
        return self._views(layer, True)

    def scales(self, layer: int):
        """int8 caches: read-only views of layer's (K, V) f32 scales, [tokens, heads] per page."""
        if self.cache._layout[4] != DTYPES["int8"]:
            raise ValueError("scales: not an int8 cache")
        return self._views(layer, False, True), self._views(layer, True, True)


_kvcache.Cache._register(Cache)
_kvcache.Lease._register(Lease)


_TORCH_FP8 = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


def torch_view(a, dtype=None):
    """A torch tensor sharing a NumPy array's memory; uint16 bits become
    torch.bfloat16 (dtype='bf16', the default for uint16 arrays); uint8 codes
    with dtype='fp8_e4m3' or 'fp8_e5m2' become torch.float8_e4m3fn or
    torch.float8_e5m2 where the installed torch has them (else they stay
    uint8: the same bits)."""
    import torch
    if a.dtype.name == "uint16":  # torch has no uint16: the same bits as int16
        t = torch.from_numpy(a.view("int16"))
        return t.view(torch.bfloat16) if dtype in (None, "bf16") else t
    t = torch.from_numpy(a)
    fp8 = getattr(torch, _TORCH_FP8.get(dtype, ""), None) if a.dtype.name == "uint8" else None
    return t.view(fp8) if fp8 is not None else t
