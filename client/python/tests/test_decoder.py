"""The reference decoder (examples/ref_decoder.py) on kvcached against the same
model with PyTorch's in-process cache: identical token ids, logits within the
dtype's tolerance.

Tolerances (max |logit difference|, logits of magnitude ~10):
  f32, bf16: 1e-4. Both caches hold the same rounded values and the model
    runs the same float ops on them, so they agree to the last bit in
    practice; bf16 K/V are rounded by the model before either cache sees them.
  int8: 0.25. kvcached quantizes K/V (absmax, one scale per token and head:
    a relative error up to 1/254 per element); the reference keeps f32.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

import kvcache
import ref_decoder as rd

TOL = {"f32": 1e-4, "bf16": 1e-4, "int8": 0.25}
PROMPTS = {1: rd.SYSTEM + [5, 6, 7, 8], 2: [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 42]}
STEPS = 10


def max_diff(a, b):
    return max(float((x[s].float() - y[s].float()).abs().max()) for x, y in zip(a, b) for s in x)


def run_both(client, dtype, read, name):
    model = rd.Model()
    kc = rd.KvcachedCache(client.open_cache(name, rd.layout(dtype)), dtype, read)
    ids, trace = rd.generate(model, kc, PROMPTS, STEPS)
    ref_ids, ref_trace = rd.generate(model, rd.TorchCache(dtype), PROMPTS, STEPS)
    return kc, ids, trace, ref_ids, ref_trace


@pytest.mark.parametrize("dtype,read", [("f32", "lease"), ("f32", "get"), ("bf16", "lease"),
                                        ("bf16", "get"), ("int8", "get")])
def test_decoder_matches_torch_cache(client, dtype, read):
    kc, ids, trace, ref_ids, ref_trace = run_both(client, dtype, read, f"dec-{dtype}-{read}")
    d = max_diff(trace, ref_trace)
    assert ids == ref_ids, f"token ids differ ({dtype}, {read}): {ids} vs {ref_ids}"
    assert d <= TOL[dtype], f"logits differ by {d} > {TOL[dtype]} ({dtype}, {read})"
    for s, p in PROMPTS.items():
        assert kc.cache.info(s)["length"] == len(p) + STEPS - 1
    print(f"decoder {dtype}/{read}: {STEPS} steps x {len(PROMPTS)} seqs, ids equal, "
          f"max |dlogit| {d:.3g}")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_decoder_on_block_tables_matches_torch_cache(arena_client, dtype):
    """The fewest-round-trips loop (doc/worker-guide.md): each step one
    cache.step(writes=...) that writes step t and leases step t+1's history,
    read in place through block tables over the arena: the same ids, and
    logits to the last bit, as PyTorch's own cache."""
    kc, ids, trace, ref_ids, ref_trace = run_both(arena_client, dtype, "step", f"bt-{dtype}")
    d = max_diff(trace, ref_trace)
    assert ids == ref_ids, f"token ids differ ({dtype}, block tables): {ids} vs {ref_ids}"
    assert d == 0, f"logits differ by {d} ({dtype}, block tables)"
    assert kc.view is not None and kc.view.block_tables.shape[0] == len(PROMPTS)
    for s, p in PROMPTS.items():
        assert kc.cache.info(s)["length"] == len(p) + STEPS - 1
    print(f"decoder {dtype}/block tables: {STEPS} steps x {len(PROMPTS)} seqs, ids equal, "
          f"logits equal")


def test_decoder_history_equals_gets(client):
    """history() after the decoder's steps holds what get() holds, mask causal."""
    kc, *_ = run_both(client, "f32", "get", "dec-hist")
    n1 = kc.lengths[1]
    k, v, mask, spans = kc.cache.history([(1, n1 - 1), (2, kc.lengths[2] - 1)])
    gk, gv = kc.cache.get(1, 0, n1)
    s1 = [s for s in spans if s[0] == 1][0]
    assert (k[:, s1[2]:s1[2] + s1[3]] == gk).all() and (v[:, s1[2]:s1[2] + s1[3]] == gv).all()
    assert mask.shape == (2, k.shape[1])
    assert (mask[0, s1[2]:s1[2] + n1] == 0).all()
    assert torch.isinf(torch.from_numpy(mask[1, s1[2]:s1[2] + n1])).all()


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_decoder_two_workers_share_system_prompt_by_attach(shared_daemon, dtype):
    """Worker A prefills with token ids; worker B (another process) attaches
    the system prompt's pages, prefills only the rest, and decodes exactly as
    the reference that computed the whole prompt itself."""
    model = rd.Model()
    with kvcache.Client(socket=shared_daemon.sock, timeout=30) as c:
        kc = rd.KvcachedCache(c.open_cache("ref-" + dtype, rd.layout(dtype)), dtype)
        rd.generate(model, kc, {100: rd.SYSTEM + [1, 2, 3]}, 2, tokens_for_index=True)
        before = c.stats(cache="ref-" + dtype)["caches"]["ref-" + dtype]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        out = subprocess.run([sys.executable, rd.__file__, "--socket", shared_daemon.sock,
                              "--dtype", dtype, "--steps", "6"], capture_output=True, text=True,
                             env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        b = json.loads(out.stdout)
        after = c.stats(cache="ref-" + dtype)["caches"]["ref-" + dtype]
    assert b["matched"] == len(rd.SYSTEM), f"attached {b['matched']} tokens, not the 32 shared"
    prompt = rd.SYSTEM + [11, 12, 13, 14, 15]
    ref_ids, ref_trace = rd.generate(model, rd.TorchCache(dtype), {200: prompt}, 6)
    assert b["ids"] == ref_ids[200]
    d = max(float((torch.tensor(x) - t[200].float()).abs().max())
            for x, t in zip(b["logits"], ref_trace))
    assert d <= TOL[dtype], f"worker B's logits differ by {d}"
    print(f"attach {dtype}: worker B matched {b['matched']} tokens, ids equal, "
          f"max |dlogit| {d:.3g}")
    hits = [k for k in after if "hit" in k]
    assert any(after[k] > before.get(k, 0) for k in hits), f"no prefix hit counted: {after}"


def test_decoder_context_shift_rerotates_keys(client):
    """Remove a middle range: the daemon moves later tokens down and re-rotates
    their keys; the reference does the same rotation in PyTorch. Decoding on
    from the shifted caches gives the same ids and logits."""
    model = rd.Model()
    kc = rd.KvcachedCache(client.open_cache("dec-shift", rd.layout("f32")), "f32", "lease")
    tc = rd.TorchCache("f32")
    prompt = {1: PROMPTS[1]}
    ids, _ = rd.generate(model, kc, prompt, 6)
    ref_ids, _ = rd.generate(model, tc, prompt, 6)
    assert ids == ref_ids
    a, b = 4, 20  # drop positions [4, 20): 16 tokens, later keys move down by 16
    k_before, v_before = kc.cache.get(1, b, b + 1)
    kc.remove_middle(1, a, b)
    tc.remove_middle(1, a, b)
    n = kc.lengths[1]
    assert client.open_cache("dec-shift").info(1)["length"] == n == tc.seqs[1][0][0].shape[0]
    k_after, v_after = kc.cache.get(1, a, a + 1)  # the token that was at b
    assert (v_after == v_before).all() and not (k_after == k_before).all()
    assert torch.equal(torch.from_numpy(k_after[:, 0]),
                       torch.stack([tc.seqs[1][l][0][a] for l in range(rd.N_LAYERS)]))
    last = {1: [ids[1][-1]]}
    ids2, tr = rd.generate(model, kc, last, 8, pos={1: n})
    ref2, rtr = rd.generate(model, tc, last, 8, pos={1: n})
    d = max_diff(tr, rtr)
    print(f"shift f32: removed [{a}, {b}), 8 steps after it, max |dlogit| {d:.3g}")
    assert ids2 == ref2, f"after the shift: {ids2} vs {ref2}"
    assert d <= 1e-3, f"logits after the shift differ by {d}"
