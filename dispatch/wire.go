package dispatch

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
)

// WireFormat selects the element format of the rows Dispatch sends. Combine
// always moves expert outputs in Config.DType.
type WireFormat uint8

const (
	// WireSame sends rows in Config.DType, bit for bit. The default.
	WireSame WireFormat = iota
	// WireFP8 sends rows as OCP FP8 E4M3 (e4m3fn, saturating at ±448) with
	// one float32 scale per reduce.E4M3Block elements, scale = amax/448, as
	// DeepEP dispatches: a row of H bfloat16 elements travels in H +
	// 4*ceil(H/128) bytes instead of 2H (0.52x at H=7168). Receivers get the
	// rows dequantized to Config.DType, or with Config.KeepFP8 the FP8 bytes
	// and scales themselves.
	WireFP8
)

// String returns "same" or "fp8".
func (w WireFormat) String() string {
	switch w {
	case WireSame:
		return "same"
	case WireFP8:
		return "fp8"
	}
	return fmt.Sprintf("WireFormat(%d)", uint8(w))
}

// ParseWireFormat parses "same" and "fp8" (or "e4m3").
func ParseWireFormat(s string) (WireFormat, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "same", "":
		return WireSame, nil
	case "fp8", "e4m3":
		return WireFP8, nil
	}
	return 0, fmt.Errorf("%w: wire format %q: want same or fp8", a2a.ErrInvalidArgument, s)
}

// wireRowBytes is the size of one row on the dispatch wire: rowBytes in
// Config.DType, or with WireFP8 the row's E4M3 bytes followed by its
// little-endian float32 scales.
func (cfg Config) wireRowBytes() int {
	if cfg.Wire == WireFP8 {
		return cfg.Hidden + 4*reduce.E4M3Scales(cfg.Hidden)
	}
	return cfg.Hidden * cfg.DType.Size()
}

// validateWire reports a wire configuration the dispatcher cannot run.
func (cfg Config) validateWire() error {
	switch {
	case cfg.Wire != WireSame && cfg.Wire != WireFP8:
		return invalidf("wire format %v", cfg.Wire)
	case cfg.KeepFP8 && cfg.Wire != WireFP8:
		return invalidf("KeepFP8 needs Wire: WireFP8, have %v", cfg.Wire)
	case cfg.Wire != WireFP8:
		return nil
	case cfg.DType != reduce.Float32 && cfg.DType != reduce.BFloat16:
		return invalidf("wire format fp8 quantizes float32 or bfloat16 rows, not %v", cfg.DType)
	case cfg.Counts != CountsInBand:
		// CountsNATS blocks carry a header in front of the rows; the FP8
		// wire layout is defined for the in-band blocks, rows only.
		return invalidf("wire format fp8 needs the in-band counts, not %v", cfg.Counts)
	}
	return nil
}

// WireRowBytes is the size of one row on the dispatch wire: RowBytes, or
// with WireFP8 Hidden FP8 bytes plus 4 bytes per scale.
func (d *Dispatcher) WireRowBytes() int { return d.wireRow }

// wireBytes converts a byte count of the DType layout (rows only, no
// headers) into the wire layout's.
func (h *Handle) wireBytes(n int) int {
	if !h.d.fp8 {
		return n
	}
	return n / h.d.rowBytes * h.d.wireRow
}

// rejectedRows is the row count a sender puts first in its in-band counts
// block for every peer when it rejects its own step (a token row it cannot
// quantize): no real count reaches it (a step has fewer than 2^31 rows), and
// every rank then skips the rows exchange, so the Comm stays usable.
const rejectedRows = math.MaxUint32

// quantizeTokens encodes every token row that has a kept assignment into
// h.qtok, one wire row per token: its E4M3 bytes, then its scales. A
// non-finite element is ErrInvalidArgument naming the token.
func (h *Handle) quantizeTokens() error {
	h.prepareQuantize()
	if h.preq != nil {
		// An inner handle of the relay path (hier.go): its rows come
		// quantized by their senders.
		h.qtok = h.preq
		return nil
	}
	h.qtok = grow(h.qtok, h.T*h.d.wireRow)
	return h.quantizeInto(h.qtok)
}

// quantizeInPack reports whether pack quantizes each token row itself, in
// the pass that places its copies (quantizeToken), instead of
// quantizeTokens quantizing every row in a pass of its own first: on the
// flat path without shared memory. Its pack runs before the counts
// exchange, so a row that cannot be quantized still rejects the step on
// every rank there. With shared memory the pack waits for the peers'
// descriptors, after the counts, and the relay path's inner handles get
// their rows quantized (preq).
func (h *Handle) quantizeInPack() bool {
	return h.d.fp8 && !h.d.shared && h.preq == nil
}

// prepareQuantize sizes the scratch of the quantization and of unwire.
func (h *Handle) prepareQuantize() {
	H := h.d.cfg.Hidden
	h.rowF, h.rowS = growFloats(h.rowF, H), growFloats(h.rowS, reduce.E4M3Scales(H))
}

// quantizeInto is quantizeTokens into dst (T wire rows).
func (h *Handle) quantizeInto(dst []byte) error {
	K := h.d.cfg.K
	h.prepareQuantize()
	for t := range h.T {
		kept := false
		for _, r := range h.plan.Row[t*K : (t+1)*K] {
			kept = kept || r >= 0
		}
		if !kept {
			continue
		}
		if err := h.quantizeToken(dst, t); err != nil {
			return err
		}
	}
	return nil
}

// quantizeToken encodes token t into its wire row of dst (T wire rows).
func (h *Handle) quantizeToken(dst []byte, t int) error {
	d := h.d
	H, rb, wb := d.cfg.Hidden, d.rowBytes, d.wireRow
	// The tokens may sit anywhere in memory: widen by bytes rather
	// than through a view that needs alignment.
	q := dst[t*wb : (t+1)*wb]
	if err := quantizeRow(d.cfg.DType, q[:H], h.rowS, h.tokens[t*rb:(t+1)*rb], h.rowF); err != nil {
		return fmt.Errorf("%w: dispatch: token %d: %w", a2a.ErrInvalidArgument, t, err)
	}
	for i, s := range h.rowS {
		binary.LittleEndian.PutUint32(q[H+4*i:], math.Float32bits(s))
	}
	return nil
}

// quantizeRow encodes src, a row of dt elements, into q and sc: from a
// typed view of src when it is aligned, else widened into tmp first (the
// caller's tokens may sit anywhere in memory).
func quantizeRow(dt reduce.DType, q []uint8, sc []float32, src []byte, tmp []float32) error {
	if dt == reduce.BFloat16 {
		if v, err := reduce.BFloat16s(src); err == nil {
			return reduce.QuantizeE4M3BF16(q, sc, v)
		}
	} else if v, err := reduce.Float32s(src); err == nil {
		return reduce.QuantizeE4M3(q, sc, v)
	}
	widen(dt, tmp, src)
	return reduce.QuantizeE4M3(q, sc, tmp)
}

// rejectStep tells every peer, through the counts exchange, that this rank
// rejected its step, so that they fail it too instead of waiting for rows
// that will not come. It returns cause.
func (h *Handle) rejectStep(cause error) error {
	d := h.d
	blk := countsBlock(d.maxLocal)
	clear(h.hdrOut)
	for j := range d.size {
		if j != d.rank {
			binary.LittleEndian.PutUint32(h.hdrOut[4*j*blk:], rejectedRows)
		}
	}
	if err := d.comm.AllToAll(h.ctx, h.hdrOut, h.hdrIn); err != nil {
		return fmt.Errorf("%w (and telling the peers failed: %w)", cause, err)
	}
	return cause
}

// peerRejected returns the error of a step rank src rejected (see
// rejectStep), or nil if its counts block is a real one.
func (h *Handle) peerRejected(src int, counts []byte) error {
	if binary.LittleEndian.Uint32(counts) != rejectedRows {
		return nil
	}
	return &a2a.Error{Kind: a2a.ErrAborted, Rank: src, Detail: fmt.Sprintf(
		"dispatch: rank %d rejected its rows for this step (see its error): every rank abandons the step, but the Comm itself was not aborted and stays usable", src)}
}

// growWire makes h.wire, the receive buffer of the FP8 wire, n bytes long,
// keeping its first keep bytes: in a shared segment when same-host peers
// write into it, else on the heap.
func (h *Handle) growWire(n, keep int) error {
	if h.d.hostPeers {
		w, err := h.sharedBuffer(&h.wireSeg, n, keep)
		if err != nil {
			return h.sharedFailure(err)
		}
		h.wire = w
		return nil
	}
	if cap(h.wire) < n {
		w := largeBytes(n)
		copy(w, h.wire[:keep])
		h.wire = w
	}
	h.wire = h.wire[:n]
	return nil
}

// wireRow is the destination of packed row at byte pos of the DType layout
// of a block whose wire bytes are blk, starting at DType offset base.
func (h *Handle) wireRowAt(blk []byte, pos, base int) []byte {
	off := h.wireBytes(pos - base)
	return blk[off : off+h.d.wireRow]
}

// unwire converts every received wire row, in h.wire, into the rows the
// experts read: dequantized to Config.DType into h.recv, row n of the wire
// to row n of recv, or with KeepFP8 split into h.recv8 (the E4M3 bytes) and
// h.scales.
func (h *Handle) unwire() {
	d := h.d
	H, rb, wb, dt := d.cfg.Hidden, d.rowBytes, d.wireRow, d.cfg.DType
	S := reduce.E4M3Scales(H)
	rows := len(h.recv) / rb
	if d.cfg.KeepFP8 {
		h.recv8 = grow(h.recv8, rows*H)
		h.scales = growFloats(h.scales, rows*S)
	}
	for n := range rows {
		w := h.wire[n*wb : (n+1)*wb]
		sc := h.rowS[:S]
		if d.cfg.KeepFP8 {
			copy(h.recv8[n*H:(n+1)*H], w[:H])
			sc = h.scales[n*S : (n+1)*S]
		}
		for i := range sc {
			sc[i] = math.Float32frombits(binary.LittleEndian.Uint32(w[H+4*i:]))
		}
		if d.cfg.KeepFP8 {
			continue
		}
		dequantizeRow(dt, h.recv[n*rb:(n+1)*rb], w[:H], sc, h.rowF)
	}
}

// dequantizeRow writes the E4M3 row q with scales sc into dst, a row of dt
// elements: through a typed view of dst in one pass (recv rows are whole
// elements from an aligned start), else through the float32 row tmp. The
// lengths match by construction, so the kernels cannot fail.
func dequantizeRow(dt reduce.DType, dst []byte, q []uint8, sc, tmp []float32) {
	if dt == reduce.BFloat16 {
		if v, err := reduce.BFloat16s(dst); err == nil {
			_ = reduce.DequantizeE4M3BF16(v, q, sc)
			return
		}
	} else if v, err := reduce.Float32s(dst); err == nil {
		_ = reduce.DequantizeE4M3(v, q, sc)
		return
	}
	_ = reduce.DequantizeE4M3(tmp, q, sc)
	narrow(dt, dst, tmp)
}

// Scales holds, with Config.KeepFP8, the float32 scales of the FP8 rows in
// Recv: reduce.E4M3Scales(Hidden) per row, row n's (row n of Recv, at byte
// n*Hidden) first at n*E4M3Scales(Hidden); element i of the row is
// E4M3ToF32(Recv()[n*Hidden+i]) * Scales()[n*S+i/E4M3Block]. Nil without
// KeepFP8, and once released.
func (h *Handle) Scales() []float32 {
	if h.released() || !h.d.cfg.KeepFP8 {
		return nil
	}
	return h.scales
}

// growWireFor sizes h.wire, with WireFP8, for a receive layout of n bytes
// in DType, keeping the wire rows of its first keep bytes.
func (h *Handle) growWireFor(n, keep int) error {
	if !h.d.fp8 {
		return nil
	}
	return h.growWire(h.wireBytes(n), h.wireBytes(keep))
}
