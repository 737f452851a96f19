"""One decode step for n sequences at once, in one parallel region: the fused step's program
(decode_step.py) run on n rows, each row one slot of the server with its own KV cache and
position.

step/batched.py's BatchDecoder gives every row its own copy of the fused step's arena and
int8 activation slots (mem [R, S], xq [R, .], ...), layer table and RoPE rows (layers
[R, L, LAYER_WIDTH], cos, sin [R, sets, Dh/2]); the caches are rows of stacked arrays (k, v
[R, slots, Hkv, row bytes], pos [R, slots]), row r of the step using cache slots[r]. The
workers run the program once, each op for rows 0..n-1 before the next op, so the barriers
the compiler placed for one row hold for n:

  PROJ    the worker's rows of W (decode_step._split), as the single step's _mv walks
          them: matrices in the file's x16 layout (in place) or with an interleaved copy
          (interleave.py, on VNNI: q4_0, q4_1, q8_0 of a rows-layout file) in groups of
          16 rows, 4, 2 or 1 sequences a tile, each row's sums added as the 16x1 tile adds
          them (the q4 tiles: as the single step's 8x1); the other q4_0/q4_1 (B = 32) row
          groups of 8 and q8_0's groups of 4 meet 4, 2 or 1 rows per tile, the weights
          unpacked once (tiles.py's "g4" / "g2" of a type's recipe: each row's sums added
          in its "g" tile's order); other matrices a tile of `tile` rows at a time (read
          from memory once, from L1 for the other rows), each row through _mv itself;
          q4_k / q6_k in x16 (on super-block activations) 4 or 1 sequences a tile
          Either way each row's result is its result alone
  ATTEND  units of (row, KV group) split between the workers (_attend_units), one barrier;
          rows of one cache (a verify step) in units of (run of its rows, KV group), each
          block of the cache read once for the run's rows (_attend_chain)
  BARRIER once for all rows
  NORM QUANT ADD ACT  decode_step's functions for them (_norm_op ..), once per row on row
          r's arena and activation slots: a call per row and op (about a thousand a 4-row step)
  others  decode_step._worker on a one-op program, once per row: its own code (MOE's
          barriers, LoRA) on row r's buffers and cache; so an op needs no branch here
          unless it is worth a batched form. (A one-op program for every op had
          cost the 4-row step dearly, the more the noisier the host: each call built
          tuples of ~17 arrays, views of every buffer, each counted in and out; not
          contention between the threads, which count views as fast as one does.)

So a row computes exactly what it computes alone in this step, whatever else is in the
step: what the single-sequence fused step computes for it, but for the interleaved q8_0
matrices' summation order. Every table and offset is the fused step's, checked there; the caller
checks the rows' arrays (n <= R, one row per cache). These kernels do not check bounds.
"""

from __future__ import annotations

import numpy as np
from numba import literally, njit, prange
from numba.extending import overload

from ..kernels.dots import LANES
from ..kernels.family import KERNELS, TILES, by_kind, codes_of, name_of, tile
from ..kernels.interleave import ILV_BLOCK, ILV_ROWS
from ..kernels.jit import GLUE, kernel
from ..kernels.kv_store import store_kv_row
from ..kernels.sync import barrier
from ..kernels.tiles import RECIPES
from ..kernels.x16 import tile_acts
from .decode_step import (
    C_EPS,
    C_NORM_OFFSET,
    F_X16,
    I_KMAX,
    KV_F16,
    KV_F32,
    KV_Q8_0,
    LAYER_FILLED,
    LAYOUT_X16,
    MAT_BLOCK,
    MAT_KIND,
    MAT_LAYOUT,
    MAT_OFF,
    MAT_ROW_BYTES,
    N_KINDS,
    SLOTS,
    _act_op,
    _add_op,
    _addr,
    _attend_group,
    _attend_multi,
    _attend_scratch,
    _attend_vectors,
    _heads,
    _norm_op,
    _prep_heads,
    _proj_row,
    _quant_op,
    _row,
    _sb_chain,
    _split,
    _split_feats,
    _worker,
)
from .ops import ACT, ADD, ATTEND, BARRIER, NORM, PROJ, QUANT, opcode, operands

TILE = 32  # weight rows per tile (a multiple of the matvec row groups: the same groups)
assert all(TILE % r.group == 0 for r in RECIPES.values() if r.group)


@kernel
def _groups(kind, w, g, xq, xd, xds, out, n):
    """out[:n, g:g + R] = W[g:g + R] @ x[:n] for a row group of R (B = 32) of type code
    `kind` (a constant: its "g" tiles, q4_0/q4_1's 8 rows, q8_0's 4); four, two, then one
    sequence per tile, each row's sums the one-sequence tile's (the single step's)."""
    literally(kind)
    t = 0
    while t + 4 <= n:
        tile(kind, "g4", w, 32, g, xq, xd, xds, t, out)
        t += 4
    if t + 2 <= n:
        tile(kind, "g2", w, 32, g, xq, xd, xds, t, out)
        t += 2
    if t < n:
        tile(kind, "g", w, 32, g, xq, xd, xds, t, out)


@kernel
def _interleaved(kind, wi, g, xq, xd, xs, xds, out, n):
    """out[:n, 16g:16g + 16] = W[16g:16g + 16] @ x[:n] from interleaved group g of W
    (interleave.py), type code `kind` (a constant): four, two, then one sequence per tile,
    each row's sums added as the one-sequence tile adds them."""
    literally(kind)
    t, i = 0, g * ILV_ROWS
    while t + 4 <= n:
        tile(kind, "i4", wi, g, xq, xd, xs, xds, t, out, i)
        t += 4
    if t + 2 <= n:
        tile(kind, "i2", wi, g, xq, xd, xs, xds, t, out, i)
        t += 2
    if t < n:
        tile(kind, "i1", wi, g, xq, xd, xs, xds, t, out, i)


def _group_rows(c: int):
    """_proj's row groups of type c: rows r0.. of the worker's as _groups or _interleaved
    tiles run them, through the interleaved copy where the matrix has one; returns the
    first row left (the last rows go through _mv, one at a time, as the single step's)."""
    R = RECIPES[name_of(c)].group
    ilv_block = ILV_BLOCK[name_of(c)] if RECIPES[name_of(c)].interleave else 0

    @njit(**GLUE)
    def rows(m, mat, row0, rows, K, xqv, xdv, xsv, xdsv, outv, blob, ilv, n, r0, r1):
        at = ilv[0][mat]
        if ilv_block and at >= 0 and row0 % ILV_ROWS == 0 and rows % ILV_ROWS == 0:
            gb = K // 32 * ilv_block  # bytes a group
            lo = at + row0 // ILV_ROWS * gb
            wi = ilv[1][lo:lo + rows // ILV_ROWS * gb].reshape((rows // ILV_ROWS, gb))
            xa = tile_acts(c, xqv)  # once for the groups (x16.py)
            for g in range(r0 // ILV_ROWS, r1 // ILV_ROWS):  # r0, r1 on ALIGN = 16
                _interleaved(c, wi, g, xa, xdv, xsv, xdsv, outv, n)
            return r1
        off, rb = m[MAT_OFF] + row0 * m[MAT_ROW_BYTES], m[MAT_ROW_BYTES]
        w = blob[off:off + rows * rb].reshape((rows, rb))
        c0 = r0 + (r1 - r0) // R * R
        for g in range(r0, c0, R):
            _groups(c, w, g, xqv, xdv, xdsv, outv, n)
        return c0
    return rows


@njit(**GLUE)
def _no_groups(m, mat, row0, rows, K, xqv, xdv, xsv, xdsv, outv, blob, ilv, n, r0, r1):
    return r0


def group_rows(kinds, kind, m, mat, row0, rows, K, xqv, xdv, xsv, xdsv, outv, blob, ilv, n,
               r0, r1):
    """_group_rows of type code `kind` among the codes kinds holds; r0 for a type without
    row-group tiles."""
    raise NotImplementedError("group_rows runs in kernels only")


@overload(group_rows, jit_options=GLUE)
def _group_rows_by_kind(kinds, kind, m, mat, row0, rows, K, xqv, xdv, xsv, xdsv, outv, blob,
                        ilv, n, r0, r1):
    codes = [c for c in codes_of(kinds) if "g4" in TILES.get(c, {})]
    chain = by_kind(codes, _group_rows, _no_groups)

    def impl(kinds, kind, m, mat, row0, rows, K, xqv, xdv, xsv, xdsv, outv, blob, ilv, n, r0,
             r1):
        return chain(kind, m, mat, row0, rows, K, xqv, xdv, xsv, xdsv, outv, blob, ilv, n, r0,
                     r1)
    return impl


def sb_x16_tokens(kinds, kind, w, xq, xd, xb, out, r0, r1):
    """Rows r0..r1-1 (multiples of 16) of a q4_k / q6_k matrix in the x16 layout for the
    xq.shape[0] sequences (x16_k.py's mm_rows_sb: four, then one a tile, each row's sums
    the one-token tile's bit for bit)."""
    raise NotImplementedError("sb_x16_tokens runs in kernels only")


@overload(sb_x16_tokens, jit_options=GLUE)
def _sb_x16_tokens(kinds, kind, w, xq, xd, xb, out, r0, r1):
    return _sb_chain(kinds, lambda c: "x16_mm_rows_sb" in KERNELS.get(c, {}),
                     lambda c: KERNELS[c]["x16_mm_rows_sb"])


@kernel
def _proj(tid, nt, op, model, bufs, n, precise, tile_rows, ilv, kinds, x16):
    """The PROJ op of worker tid for rows 0..n-1: its rows of W as the single step splits
    them; a type with row-group tiles (group_rows: through the matrix's interleaved copy
    where it has one (ilv = (byte offset per matrix or -1, bytes)), else its row groups)
    meets all n rows per tile, the other rows a tile of `tile_rows` rows at a time, each
    row through the single step's _mv."""
    prog, mats, consts, params, ints_all, blob, lora = model
    mem, shared, private, xq, xd, xs, xds, kq, scores, state = bufs[:10]
    ints = ints_all[0]
    o = operands(op, PROJ)
    m = mats[o.mat]
    rows, K, slot = o.rows, o.cols, tid * SLOTS + o.slot
    r0, r1 = _split(rows, tid, nt)
    float_acts = precise or o.float_acts != 0
    c0 = r0
    if not float_acts and m[MAT_BLOCK] == 32:
        kmax = ints[I_KMAX]
        q0, b0, nb = slot * kmax, slot * (kmax // 32), K // 32
        dst = _addr(shared, private, tid, o.dst)
        c0 = group_rows(kinds, m[MAT_KIND], m, o.mat, o.row0, rows, K, xq[:n, q0:q0 + K],
                        xd[:n, b0:b0 + nb], xs[:n, 2 * b0:2 * b0 + nb], xds[:n, b0:b0 + nb],
                        mem[:n, dst:dst + rows], blob, ilv, n, r0, r1)
    elif not float_acts and o.sb != 0 and x16 is not None and m[MAT_LAYOUT] == LAYOUT_X16:
        # q4_k, q6_k in x16: the slots hold super-block activations (_act_k's, row by row)
        kmax = ints[I_KMAX]
        q0, b0 = slot * kmax, slot * (kmax // 32)
        off, rb = m[MAT_OFF] + o.row0 * m[MAT_ROW_BYTES], m[MAT_ROW_BYTES]
        wi = blob[off:off + rows * rb].reshape((rows // 16, 16 * rb))
        dst = _addr(shared, private, tid, o.dst)
        sb_x16_tokens(kinds, m[MAT_KIND], wi, xq[:n, q0:q0 + K], xd[:n, b0:b0 + K // 256],
                      xs[:n, 2 * b0:2 * b0 + K // 16], mem[:n, dst:dst + rows], r0, r1)
        c0 = r1
    while c0 < r1:
        c1 = min(r1, c0 + tile_rows)
        for r in range(n):
            h = _row(mem[r], shared, private, tid, o.src, K)
            out = _row(mem[r], shared, private, tid, o.dst, rows)
            _proj_row(blob, m, o, h, xq[r], xd[r], xs[r], xds[r], ints, slot, out, c0, c1,
                      precise, kinds, x16)
        c0 = c1
    if o.bias >= 0:
        b = params[o.bias:o.bias + rows]
        for r in range(n):
            out = _row(mem[r], shared, private, tid, o.dst, rows)
            for j in range(r0, r1):
                out[0, j] += b[j]


@kernel
def _attend_batch(tid, nt, op, model, bufs, kv, pos, slots, n, f32, f16, q8_0):
    """The ATTEND op of worker tid for rows 0..n-1: the cache's bytes viewed as its kv_type
    (decode_step._attend), then _attend_units."""
    k, v = kv[0], kv[1]
    rb, Dh = k.shape[3] * k.itemsize, bufs[7].shape[2]
    if rb == 4 * Dh:
        if f32 is not None:
            _attend_units(tid, nt, op, model, bufs, kv, k.view(np.float32), v.view(np.float32),
                          pos, slots, n)
    elif rb == 2 * Dh:
        if f16 is not None:
            _attend_units(tid, nt, op, model, bufs, kv, k.view(np.uint16), v.view(np.uint16),
                          pos, slots, n)
    elif q8_0 is not None:
        _attend_units(tid, nt, op, model, bufs, kv, k.view(np.uint8), v.view(np.uint8), pos,
                      slots, n)


@kernel
def _attend_units(tid, nt, op, model, bufs, kv, k_all, v_all, pos, slots, n):
    """Attention of rows 0..n-1 in units of (row, KV group): n * Hkv units split between the
    workers, each unit all of its group's query heads (decode_step._attend_group, whose
    heads are independent: each head's result is the single step's, whichever worker had
    it there). A unit is the only reader of its row's cache rows of its KV head, so it
    stores this token's k, v there at once; after the one barrier, the owner of each row's
    KV head 0 records the slot's position (which every unit of the row reads).
    Rows of one cache (a verify step) go through _attend_chain instead.
    k_all, v_all [R, slots, Hkv, width] as stored (kv_rows)."""
    if _repeats(slots, n):
        _attend_chain(tid, nt, op, model, bufs, kv, k_all, v_all, pos, slots, n)
        return
    scratch, u0, u1 = _attend_setup(tid, nt, op, model, bufs, k_all, n)
    for u in range(u0, u1):
        _attend_unit(tid, u, model, bufs, kv, k_all, v_all, pos, slots, scratch, True, True)
    barrier(bufs[9], nt)
    _record_positions(scratch[0], kv, k_all, pos, slots, u0, u1)


@kernel
def _repeats(slots, n):
    """Whether a cache has several of rows 0..n-1 (a sequence's next positions)."""
    for a in range(1, n):
        for b in range(a):
            if slots[a] == slots[b]:
                return True
    return False


@kernel
def _attend_chain(tid, nt, op, model, bufs, kv, k_all, v_all, pos, slots, n):
    """_attend_units where rows share a cache, row j of a cache at its next position + j
    (its layer table's slot and filled count those of the single step there). Every
    unit first stores its row's k, v and position in its slot; after a barrier every row
    attends over its filled slots: the rows before it are there as the single step
    stored them, the rows after it (positions past its own) masked as the slots they
    overwrote would have been (batched.check_rows: out of the window), so each row
    attends as the single step at its position, bit for bit. The attention runs in units
    of (run of rows of one cache, KV group) (_runs), all the run's rows per key block read
    (decode_step._attend_multi). A second barrier ends the op, as the first ends
    _attend_units."""
    scratch, u0, u1 = _attend_setup(tid, nt, op, model, bufs, k_all, n)
    for u in range(u0, u1):  # store
        _attend_unit(tid, u, model, bufs, kv, k_all, v_all, pos, slots, scratch, False, True)
    _record_positions(scratch[0], kv, k_all, pos, slots, u0, u1)
    barrier(bufs[9], nt)
    Hkv = k_all.shape[2]
    # runs no longer than n / nt where the KV groups alone do not split evenly
    most = n if Hkv % nt == 0 else (n + nt - 1) // nt
    runs = _runs(slots, n, most, -1)
    w0, w1 = _heads(runs * Hkv, tid, nt)
    for u in range(w0, w1):  # attend
        a, b = _run(slots, n, most, u // Hkv)
        _attend_run(tid, u % Hkv, a, b, model, bufs, kv, k_all, v_all, pos, slots, scratch)
    barrier(bufs[9], nt)


@kernel
def _runs(slots, n, most, k):
    """Rows 0..n-1 cut into runs of consecutive rows of one cache, at most `most` rows each:
    the number of runs (k < 0), else run k's first row."""
    count, length = 0, 0
    for r in range(n):
        if r == 0 or slots[r] != slots[r - 1] or length == most:
            if count == k:
                return r
            count, length = count + 1, 0
        length += 1
    return count if k < 0 else n


@kernel
def _run(slots, n, most, k):
    """Run k's rows [a, b) (_runs)."""
    return _runs(slots, n, most, k), _runs(slots, n, most, k + 1)


@kernel
def _attend_run(tid, kvh, a, b, model, bufs, kv, k_all, v_all, pos, slots, scratch):
    """KV group kvh of rows a..b (one cache's consecutive positions): each row's query
    heads and key rotated (as _attend_unit's), then decode_step._attend_multi over them."""
    prog, mats, consts, params, ints_all, blob, lora = model
    mem, shared, private = bufs[0], bufs[1], bufs[2]
    mq, msc = bufs[10][tid], bufs[11][tid]
    _, _, pos_all, layers, cos_all, sin_all = kv
    o, scale, softcap, group, Hq, Dh, kbuf, qbuf, tile, sc, stats = scratch
    Hkv = k_all.shape[2]
    c, nr = slots[a], b - a
    lt = layers[a, o.layer]
    start, cap, window = lt[0], lt[1], lt[2]
    ks, qs = mq[:nr], mq[nr:nr + nr * group]
    hq = kvh * group
    for j in range(a, b):
        q, k, v, out = _attend_vectors(o, mem[j], shared, private, tid, Hq, Hkv, Dh)
        cos, sin = cos_all[j, o.rope:o.rope + 1], sin_all[j, o.rope:o.rope + 1]
        i = j - a
        _prep_heads(o, consts, params, ints_all[j], q, k, kvh, hq, group, ks[i],
                    qs[i * group:(i + 1) * group], cos, sin)
    v_at, out_at = _addr(shared, private, tid, o.v), _addr(shared, private, tid, o.dst)
    _attend_multi(qs, ks, mem, v_at, out_at, a, b, k_all[c, start:start + cap],
                  v_all[c, start:start + cap], pos_all[c, start:start + cap], kvh, group, Hq,
                  pos, layers[:, o.layer, LAYER_FILLED], window, scale, softcap,
                  msc[:nr * group], msc[nr * group:nr * group + 1], tile[:LANES])


@kernel
def _attend_setup(tid, nt, op, model, bufs, k_all, n):
    """Both forms' start: ATTEND's operands and worker tid's scratch
    (decode_step._attend_scratch), and the worker's units [u0, u1) of the n * Hkv."""
    Hkv = k_all.shape[2]
    u0, u1 = _heads(n * Hkv, tid, nt)
    return _attend_scratch(tid, op, model[2], bufs[7], bufs[8], Hkv), u0, u1


@kernel
def _attend_unit(tid, u, model, bufs, kv, k_all, v_all, pos, slots, scratch, attend, store):
    """Unit u = (row r, KV head kvh) at row r's position: its k rotated (into the scratch's
    kbuf); with `attend`, its query heads attending over the filled slots of the row's
    cache (decode_step._attend_group); then, with `store`, its k, v stored in its slot."""
    prog, mats, consts, params, ints_all, blob, lora = model
    mem, shared, private = bufs[0], bufs[1], bufs[2]
    _, _, pos_all, layers, cos_all, sin_all = kv
    o, scale, softcap, group, Hq, Dh, kbuf, qbuf, tile, sc, stats = scratch
    Hkv = k_all.shape[2]
    r, kvh = u // Hkv, u % Hkv
    c, p = slots[r], pos[r]
    lt = layers[r, o.layer]
    start, cap, window, slot, filled = lt[0], lt[1], lt[2], lt[3], lt[4]
    kc, vc = k_all[c, start:start + cap], v_all[c, start:start + cap]
    cos, sin = cos_all[r, o.rope:o.rope + 1], sin_all[r, o.rope:o.rope + 1]
    q, k, v, out = _attend_vectors(o, mem[r], shared, private, tid, Hq, Hkv, Dh)
    hq = kvh * group
    vh = v[kvh * Dh:(kvh + 1) * Dh]
    _prep_heads(o, consts, params, ints_all[r], q, k, kvh, hq, group if attend else 0, kbuf,
                qbuf, cos, sin)
    if attend:
        cpos = pos_all[c, start:start + cap]
        _attend_group(qbuf, group, kbuf, vh, kc[:filled], vc[:filled], cpos[:filled], kvh,
                      p, window, scale, softcap, sc, stats, out, hq, tile)
    if store:
        store_kv_row(kbuf, kc[slot, kvh], tile)
        store_kv_row(vh, vc[slot, kvh], tile)


@kernel
def _record_positions(o, kv, k_all, pos, slots, u0, u1):
    """Each row's position in its slot of ATTEND o's layer, by the owner of the row's KV
    head 0 among units [u0, u1) (after _attend_units' barrier: every unit of the row read
    the slot's old position; before _attend_chain's: every unit reads the new one)."""
    _, _, pos_all, layers, _, _ = kv
    Hkv = k_all.shape[2]
    for u in range(u0, u1):
        r = u // Hkv
        if u % Hkv == 0:
            lt = layers[r, o.layer]
            pos_all[slots[r], lt[0] + lt[3]] = pos[r]


@kernel
def _batch_worker(tid, nt, model, bufs, kv, pos, slots, n, precise, tile, ilv, feats):
    """Worker tid's run of the program over rows 0..n-1 (see the module docstring)."""
    prog, mats, consts, params, ints_all, blob, lora = model
    mem, shared, private, xq, xd, xs, xds, kq, scores, state = bufs[:10]
    k_all, v_all, pos_all, layers, cos, sin = kv
    eps, offset = consts[C_EPS], consts[C_NORM_OFFSET]
    for i in range(prog.shape[0]):
        op = prog[i]
        code = opcode(op)
        if code == PROJ:
            _proj(tid, nt, op, model, bufs, n, precise, tile, ilv, feats[:N_KINDS],
                  feats[F_X16])
        elif code == BARRIER:  # once for all rows
            barrier(state, nt)
        elif code == ATTEND:
            _attend_batch(tid, nt, op, model, bufs, kv, pos, slots, n, feats[KV_F32],
                          feats[KV_F16], feats[KV_Q8_0])
        elif code == NORM:
            for r in range(n):
                _norm_op(op, mem[r], shared, private, tid, params, eps, offset)
        elif code == QUANT:
            if not precise:
                for r in range(n):
                    _quant_op(op, mem[r], shared, private, tid, xq[r], xd[r], xs[r], xds[r],
                              ints_all[r])
        elif code == ADD:
            for r in range(n):
                _add_op(op, mem[r], shared, private, tid, nt, consts)
        elif code == ACT:
            for r in range(n):
                _act_op(op, mem[r], shared, private, tid, nt)
        else:  # every other op (SCALE, SOFTCAP, ROUTE, MOE, LORA_*, a new one): a one-op
            # program through the single interpreter's branch, once per row
            for r in range(n):
                c = slots[r]
                _worker(tid, nt, (prog[i:i + 1], mats, consts, params, ints_all[r], blob, lora),
                        (mem[r], shared, private, xq[r], xd[r], xs[r], xds[r], kq, scores,
                         state),
                        (k_all[c], v_all[c], pos_all[c], layers[r], cos[r], sin[r]), pos[r],
                        precise, *_split_feats(feats))


@kernel(parallel=True)
def batch_parallel(nt, model, bufs, kv, pos, slots, n, precise, tile, ilv, feats):
    """One step of rows 0..n-1 on nt threads (nt == numba.get_num_threads(), omp layer).

    model: the fused step's tables, with ints [R, .] (a copy per row: MoE's routes);
    bufs = (mem [R, S], shared, private, xq, xd, xs, xds [R, .], kq, scores, state, run_q,
    run_scores): per-row arenas and act slots, shared attention scratch and barrier, the
    verify rows' attention scratch (batched.py); kv = (k, v
    [R, slots, Hkv, row bytes] (bytes, as the fused step passes them: its _worker's
    types), pos [R, slots], layers [R, L, LAYER_WIDTH], cos, sin [R, sets, Dh/2]): caches
    by slot, the rest by row; pos [R], slots [R]: each row's position and cache; ilv =
    (int64 [mats] byte offset of each matrix's interleaved copy in uint8 bytes, or -1;
    bytes), step/batched.py's; feats: the fused step's (decode_step.py).
    """
    for tid in prange(nt):  # tid as int64: prange's is uint64, which would compile
        _batch_worker(np.int64(tid), nt, model, bufs, kv, pos, slots, n, precise, tile, ilv,
                      feats)  # _batch_worker (and _worker under it) a second time


@kernel
def batch_serial(model, bufs, kv, pos, slots, n, precise, tile, ilv, feats):
    """One step of rows 0..n-1 on the calling thread."""
    _batch_worker(np.int64(0), np.int64(1), model, bufs, kv, pos, slots, n, precise, tile,
                  ilv, feats)  # int64s: batch_parallel's _batch_worker, not another compile
