"""decode_step._attend_heads: the decode step's attention over all of a worker's heads in one
pass over the cache. Each head's result is the one-group call's bit for bit (the batched
step attends one KV group at a time and must equal the single step), whatever heads share a
call, and matches a numpy softmax attention."""

import numpy as np
import pytest

from edgellm.kernels.kv_store import encode_q8_0
from edgellm.step.decode_step import _attend_group, _attend_heads

Hq, Hkv, Dh, N, P = 9, 3, 64, 37, 40  # 37 slots: two blocks of 16 and a tail
GROUP = Hq // Hkv
SCALE = np.float32(Dh ** -0.5)


def _setup(kind):
    rng = np.random.default_rng(1)
    kf = rng.standard_normal((N, Hkv, Dh)).astype(np.float32)
    vf = rng.standard_normal((N, Hkv, Dh)).astype(np.float32)
    q = rng.standard_normal((Hq, Dh)).astype(np.float32)
    kb = rng.standard_normal((Hkv, Dh)).astype(np.float32)
    vb = rng.standard_normal((Hkv, Dh)).astype(np.float32)
    cpos = np.arange(N, dtype=np.int32)
    cpos[5] = -1  # an empty slot
    cpos[9] = P + 3  # a position past this token's

    def enc(x):
        if kind == "f32":
            return x
        if kind == "f16":
            return x.astype(np.float16).view(np.uint16)
        out = np.empty((N * Hkv, Dh // 32 * 34), np.uint8)
        encode_q8_0(x.reshape(-1, Dh), out)
        return out.reshape(N, Hkv, -1)
    return q, kb, vb, kf, vf, enc(kf), enc(vf), cpos


def _heads(q, kb, vb, kc, vc, cpos, h0, h1, out):
    scores = np.zeros((Hq, N), np.float32)
    stats = np.zeros((1, max(N, Hq)), np.float32)
    tile = np.zeros((16, Dh), np.float32)
    _attend_heads(q[h0:h1], kb, vb, 0, kc, vc, cpos, h0, h1, GROUP, P, 0, SCALE,
                  np.float32(0.0), scores, stats, out, tile)


@pytest.mark.parametrize("kind", ["f32", "f16", "q8_0"])
def test_heads_equal_one_group_calls_bit_for_bit(kind):
    q, kb, vb, kf, vf, kc, vc, cpos = _setup(kind)
    whole = np.zeros(Hq * Dh, np.float32)
    _heads(q, kb, vb, kc, vc, cpos, 0, Hq, whole)
    split = np.zeros(Hq * Dh, np.float32)
    for h0, h1 in ((0, 4), (4, 5), (5, 9)):  # splits inside KV groups, as workers do
        _heads(q, kb, vb, kc, vc, cpos, h0, h1, split)
    groups = np.zeros(Hq * Dh, np.float32)
    for kvh in range(Hkv):
        scores = np.zeros((GROUP, N), np.float32)
        stats = np.zeros((1, N), np.float32)
        tile = np.zeros((16, Dh), np.float32)
        _attend_group(q[kvh * GROUP:(kvh + 1) * GROUP].copy(), GROUP, kb[kvh], vb[kvh], kc,
                      vc, cpos, kvh, P, 0, SCALE, np.float32(0.0), scores, stats, groups,
                      kvh * GROUP, tile)
    assert np.array_equal(whole, split)
    assert np.array_equal(whole, groups)


def test_heads_match_softmax_attention():
    q, kb, vb, kf, vf, kc, vc, cpos = _setup("f32")
    out = np.zeros(Hq * Dh, np.float32)
    _heads(q, kb, vb, kc, vc, cpos, 0, Hq, out)
    seen = (cpos >= 0) & (cpos < P)
    for hq in range(Hq):
        kvh = hq // GROUP
        keys = np.concatenate([kf[seen, kvh], kb[kvh:kvh + 1]]).astype(np.float64)
        vals = np.concatenate([vf[seen, kvh], vb[kvh:kvh + 1]]).astype(np.float64)
        s = keys @ q[hq].astype(np.float64) * float(SCALE)
        w = np.exp(s - s.max())
        ref = (w / w.sum()) @ vals
        np.testing.assert_allclose(out[hq * Dh:(hq + 1) * Dh], ref, rtol=1e-4, atol=1e-5)



def test_f16_rows_read_in_place_attend_as_their_float32_values():
    """The f16 cache's rows read in place (dots16 / wsum_rows convert them as they load,
    exactly) attend as a float32 cache holding the same values. The row kernels give the
    same bits on either (tests/test_decode_kernels.py); inlined into the step, LLVM may
    contract the two specializations' float work differently on some CPUs (a recorded Zen
    hash did not hold on Sapphire Rapids), so here the step agrees within a few ulp."""
    q, kb, vb, kf, vf, kc, vc, cpos = _setup("f16")
    got, want = np.zeros(Hq * Dh, np.float32), np.zeros(Hq * Dh, np.float32)
    _heads(q, kb, vb, kc, vc, cpos, 0, Hq, got)
    as32 = [c.view(np.float16).astype(np.float32) for c in (kc, vc)]
    _heads(q, kb, vb, *as32, cpos, 0, Hq, want)
    np.testing.assert_allclose(got, want, rtol=0, atol=4e-7 * np.abs(want).max())


@pytest.mark.parametrize("kind,softcap", [("f32", 0.0), ("f16", 0.0), ("q8_0", 0.0),
                                          ("f16", 3.0)])
def test_rows_in_one_pass_equal_each_row_alone_bit_for_bit(kind, softcap):
    """_attend_multi (a verify step's rows of one cache, each key block read once for all
    of them) gives each row what the one-group call gives it alone: rows whose slot counts
    end inside a block of 16, on its edge and past it (the scalar tail of one row is dots16
    of the next), at their own positions."""
    from edgellm.step.decode_step import _attend_multi

    q, kb, vb, kf, vf, kc, vc, cpos = _setup(kind)
    rng = np.random.default_rng(7)
    fill = np.array([29, 31, 32, 33, 36, 37], np.int64)  # slots each row has written
    R = fill.shape[0]
    pos = (P - R + np.arange(R)).astype(np.int64)
    qs = rng.standard_normal((R, Hq, Dh)).astype(np.float32)
    ks = rng.standard_normal((R, Hkv, Dh)).astype(np.float32)
    vs = rng.standard_normal((R, Hkv * Dh)).astype(np.float32)
    cap = np.float32(softcap)
    v_at, out_at = 3, 3 + Hkv * Dh  # the rows' arenas: value, then output
    for a, b in ((0, R), (1, 4), (5, 6)):
        mem = np.zeros((R, out_at + Hq * Dh), np.float32)
        mem[:, v_at:v_at + Hkv * Dh] = vs
        want = np.zeros((R, Hq * Dh), np.float32)
        for kvh in range(Hkv):
            g0 = kvh * GROUP
            qr = np.ascontiguousarray(qs[a:b, g0:g0 + GROUP].reshape(-1, Dh))
            kr = np.ascontiguousarray(ks[a:b, kvh])
            scores = np.zeros(((b - a) * GROUP, N), np.float32)
            stats = np.zeros((1, max(N, (b - a) * GROUP)), np.float32)
            tile = np.zeros((16, Dh), np.float32)
            _attend_multi(qr, kr, mem, v_at, out_at, a, b, kc, vc, cpos, kvh, GROUP, Hq,
                          pos, fill, 0, SCALE, cap, scores, stats, tile)
            for j in range(a, b):
                n = fill[j]
                scores = np.zeros((GROUP, N), np.float32)
                stats = np.zeros((1, N), np.float32)
                _attend_group(qs[j, g0:g0 + GROUP].copy(), GROUP, ks[j, kvh].copy(),
                              vs[j, kvh * Dh:(kvh + 1) * Dh].copy(), kc[:n], vc[:n], cpos[:n],
                              kvh, pos[j], 0, SCALE, cap, scores, stats, want[j], g0, tile)
        got = mem[a:b, out_at:]
        assert np.array_equal(got.view(np.uint32), want[a:b].view(np.uint32)), (a, b)
        assert b - a == 1 or not np.array_equal(got[0], got[-1])  # rows that differ
