package transport

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// The LL slot format, which every Slots transport writes and reads, in one
// of two forms (the word form here, the packed form below); only how the
// words reach the reader is the transport's (shm stores packed slots into the
// peer's mapped segment, verbs writes a staged copy of a word-form slot into
// the peer's registered window by RDMA WRITE). A slot is a length word
// followed by the data words, 8 bytes each; in the word form every word
// carries the LL epoch in its high half:
//
//	data word j  payload bytes 4j..4j+3, little endian (the last zero-padded) | epoch<<32
//	length word  len | tag<<SlotLenBits | epoch<<32
//
// The writer stores the data words, then the length word last with release
// order. The reader takes, with atomic loads, the words that carry its
// epoch; the message is complete once the length word and every data word
// it announces do. Completion is the epoch in every word, so no word needs
// clearing, and words may become visible in any order (an RDMA device places
// them so).

// The packed form of the slot, for a transport whose stores become visible
// to the reader in the order they were made (shm: the cores of one machine):
// the payload bytes as they are from w[1] on, 8 to a word, then the same
// length word, last, with release order. The reader loads the length word,
// and once it carries the epoch the whole payload is there: it copies it
// out in one go. (It asks for a small message's later lines just before
// the length word, pullLines, but reads them only after.) Only the length
// word signals (a payload word may hold any bits). Against the word form it
// moves half the cache lines, with Go's copy on both sides instead of a
// word at a time; one machine's stores never land out of order, which is
// all the word form is for.

// SlotLenBits is the width of the message length in a length word; the tag
// sits above it. Slots hold far less than 1<<SlotLenBits bytes.
const SlotLenBits = 32 - SlotTagBits

const (
	slotLenMask = 1<<SlotLenBits - 1
	lo32        = 0xffffffff
)

// SlotSize resolves a slot-size setting of a transport whose default slot
// holds def bytes: 0 is def, a negative setting means no LL window (0).
func SlotSize(setting, def int) int {
	switch {
	case setting == 0:
		return def
	case setting < 0:
		return 0
	}
	return setting
}

// SlotWords is the number of data words of an LL message of n bytes.
func SlotWords(n int) int { return (n + 3) / 4 }

// EncodeSlot writes data for epoch into the data words of slot w (w[1:], at
// least SlotWords(len(data)) of them) with plain 8-byte stores, and returns
// the length word for len(data) and tag (< 1<<SlotTagBits), which the caller
// stores into w[0] last: with release order where a reader may be watching
// w. A plain aligned 8-byte store is atomic on 64-bit targets; an atomic
// store per word (an XCHG on amd64) made an 8 KiB message take 10.5 us
// instead of 1.
func EncodeSlot(w []uint64, epoch, tag uint32, data []byte) uint64 {
	hi := uint64(epoch) << 32
	n := len(data)
	d, src := w[1:1+SlotWords(n)], data
	for len(d) >= 4 && len(src) >= 16 {
		v0, v1 := binary.LittleEndian.Uint64(src), binary.LittleEndian.Uint64(src[8:16])
		d[0], d[1], d[2], d[3] = v0&lo32|hi, v0>>32|hi, v1&lo32|hi, v1>>32|hi
		d, src = d[4:], src[16:]
	}
	for len(d) > 0 && len(src) >= 4 {
		d[0] = uint64(binary.LittleEndian.Uint32(src)) | hi
		d, src = d[1:], src[4:]
	}
	if len(d) > 0 { // the last word, zero-padded
		var b [4]byte
		copy(b[:], src)
		d[0] = uint64(binary.LittleEndian.Uint32(b[:])) | hi
	}
	return uint64(n) | uint64(tag)<<SlotLenBits | hi
}

// PackedWords is the number of data words of a packed message of n bytes.
func PackedWords(n int) int { return (n + 7) / 8 }

// EncodePacked writes data into the data words of slot w (w[1:], at least
// PackedWords(len(data)) of them) in the packed form, and returns the length
// word for epoch and tag (< 1<<SlotTagBits), which the caller stores into
// w[0] last, with release order.
func EncodePacked(w []uint64, epoch, tag uint32, data []byte) uint64 {
	copy(wordBytes(w[1:1+PackedWords(len(data))]), data)
	return uint64(len(data)) | uint64(tag)<<SlotLenBits | uint64(epoch)<<32
}

// PackedStored reports whether packed slot w holds the message for epoch:
// its length word carries epoch.
func PackedStored(w []uint64, epoch uint32) bool {
	return atomic.LoadUint64(&w[0])>>32 == uint64(epoch)
}

// TakePacked is Take for a packed slot: once the length word carries epoch
// it checks it as Take does and copies the whole message into dst (done).
// Before the length word it loads one word of each later line of a message
// of len(dst) bytes (pullLines), so that those lines travel with it. st
// records the length, as Take's does.
func (win *SlotWindow) TakePacked(peer int, w []uint64, epoch, tag uint32, dst []byte, anyLen bool, st *SlotLoad) (bool, error) {
	pullLines(w, len(dst))
	lw := atomic.LoadUint64(&w[0])
	if lw>>32 != uint64(epoch) {
		return false, nil
	}
	if err := win.checkLen(peer, lw, tag, len(dst), anyLen); err != nil {
		return false, err
	}
	n := int(lw & slotLenMask)
	copy(dst[:n], wordBytes(w[1:1+PackedWords(n)]))
	st.Len, st.Known, st.Words = n, true, PackedWords(n)
	return true, nil
}

// wordsPerLine is the words of one cache line of 64 bytes (amd64's, most
// arm64 cores').
const wordsPerLine = 64 / 8

// pullMaxLines is the most cache lines past the length word's that a load
// pulls (pullLines): messages of up to 568 bytes, nine lines with the
// length word.
const pullMaxLines = 8

// pullLines loads one word of every cache line past the first that a
// message of n bytes takes in packed slot w, so that a reader about to load
// the length word asks for those lines together with it. Otherwise it asks
// for them only once it has seen the length word, one cross-core transfer
// after the other: at 2 ranks over shm, a 64 B AllToAllV (two lines) took
// ~0.13 us more than a 56 B one (one line) where a transfer costs ~0.3 us.
// The words are read while the writer may still be filling them and
// dropped: TakePacked reads the message after the length word, and a line
// pulled too early is taken from the writer again.
//
// Messages of more lines are not pulled: a reader that keeps asking for ten
// or more lines while the writer fills them holds the writer up (a C model
// of the exchange: 576 B went from 0.55 to 1.5 us).
func pullLines(w []uint64, n int) {
	end := min(1+PackedWords(n), len(w))
	if end > wordsPerLine*(1+pullMaxLines) {
		return
	}
	for i := wordsPerLine; i < end; i += wordsPerLine {
		atomic.LoadUint64(&w[i])
	}
}

// wordBytes is the byte view of words w.
func wordBytes(w []uint64) []byte {
	if len(w) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), 8*len(w))
}

// SlotBegun reports whether slot w holds a message for epoch, or the first
// of its words: its length word or its first data word carries epoch.
func SlotBegun(w []uint64, epoch uint32) bool {
	e := uint64(epoch)
	return atomic.LoadUint64(&w[0])>>32 == e || (len(w) > 1 && atomic.LoadUint64(&w[1])>>32 == e)
}

// SlotWindow is what the slot format needs to know of one transport's LL
// window: whose it is, the capacity of its slots, and the transport's name
// for errors.
type SlotWindow struct {
	Name  string // the transport's name, which prefixes errors ("shm")
	Rank  int    // this rank, whose window it is
	Bytes int    // payload capacity of a slot
}

// CheckStore checks the arguments of a Slots.Store of n bytes into this
// rank's slot at peer, where slot says whether peer has one. Every fault is
// fault.ErrInvalidArgument: no slot, more than Bytes, an epoch below
// FirstEpoch or a tag of more than SlotTagBits bits.
func (win *SlotWindow) CheckStore(peer int, slot bool, epoch, tag uint32, n int) error {
	if slot && n <= win.Bytes && epoch >= FirstEpoch && tag < 1<<SlotTagBits {
		return nil
	}
	return win.storeError(peer, slot, epoch, tag, n)
}

// storeError is CheckStore's error, kept off its path.
func (win *SlotWindow) storeError(peer int, slot bool, epoch, tag uint32, n int) error {
	switch {
	case !slot:
		return win.noSlot(peer)
	case n > win.Bytes:
		return fault.New(fault.ErrInvalidArgument, peer, "%s: small message (LL) of %d bytes to rank %d, its mailbox (LL slot) holds %d", win.Name, n, peer, win.Bytes)
	case epoch < FirstEpoch:
		return win.badEpoch(peer, epoch)
	}
	return fault.New(fault.ErrInvalidArgument, peer, "%s: small-message (LL) tag %#x wider than %d bits", win.Name, tag, SlotTagBits)
}

// CheckLoad checks the arguments of a Slots.Load of peer's message into n
// bytes (with anyLen: at most n), where slot says whether peer has a slot
// in this rank's window. Every fault is fault.ErrInvalidArgument: no slot,
// more than Bytes unless anyLen, or an epoch below FirstEpoch.
func (win *SlotWindow) CheckLoad(peer int, slot bool, epoch uint32, n int, anyLen bool) error {
	if slot && (anyLen || n <= win.Bytes) && epoch >= FirstEpoch {
		return nil
	}
	return win.loadError(peer, slot, epoch, n, anyLen)
}

// loadError is CheckLoad's error, kept apart so that CheckLoad, which every
// poll of a Load passes, inlines.
func (win *SlotWindow) loadError(peer int, slot bool, epoch uint32, n int, anyLen bool) error {
	switch {
	case !slot:
		return win.noSlot(peer)
	case !anyLen && n > win.Bytes:
		return fault.New(fault.ErrInvalidArgument, peer, "%s: small message (LL) of %d bytes from rank %d, its mailbox (LL slot) holds %d", win.Name, n, peer, win.Bytes)
	}
	return win.badEpoch(peer, epoch)
}

func (win *SlotWindow) noSlot(peer int) error {
	return fault.New(fault.ErrInvalidArgument, peer, "%s: rank %d has no small-message mailbox (LL slot) at rank %d", win.Name, win.Rank, peer)
}

// badEpoch refuses the epochs no LL message uses: zeroed memory carries them.
func (win *SlotWindow) badEpoch(peer int, epoch uint32) error {
	return fault.New(fault.ErrInvalidArgument, peer, "%s: small-message (LL) epoch %d (epochs start at %d)", win.Name, epoch, FirstEpoch)
}

// Take is one step of a Slots.Load: it copies into dst the words of slot w
// (the length word, then SlotWords(win.Bytes) data words) that peer stored
// for epoch and st has not taken yet, and reports done once the whole
// message is in. Before the length is known it takes the words that fit
// dst; with anyLen only those followed by another word of the epoch, so that
// the padding of a shorter message's last word never lands in dst. A length
// word with another tag, a length beyond the slot, or one dst cannot take
// (not len(dst) unless anyLen) fails with fault.ErrMismatch.
func (win *SlotWindow) Take(peer int, w []uint64, epoch, tag uint32, dst []byte, anyLen bool, st *SlotLoad) (bool, error) {
	e := uint64(epoch)
	if !st.Known {
		if lw := atomic.LoadUint64(&w[0]); lw>>32 == e {
			if err := win.checkLen(peer, lw, tag, len(dst), anyLen); err != nil {
				return false, err
			}
			st.Len, st.Known = int(lw&slotLenMask), true
		}
	}
	d := w[1:]
	if !st.Known {
		takeFitting(d, e, dst, anyLen, st)
		return false, nil
	}
	// The hot path of every small message: kept in Take, not a call away.
	n, k := st.Len, st.Words
	// Four words at a time while they carry 16 whole bytes.
	if he := e << 32; 4*k+16 <= n {
		src, out := d[k:], dst[4*k:n]
		for len(src) >= 4 && len(out) >= 16 {
			a, b := atomic.LoadUint64(&src[0]), atomic.LoadUint64(&src[1])
			c, f := atomic.LoadUint64(&src[2]), atomic.LoadUint64(&src[3])
			if ((a^he)|(b^he)|(c^he)|(f^he))>>32 != 0 {
				break
			}
			binary.LittleEndian.PutUint64(out, a&lo32|b<<32)
			binary.LittleEndian.PutUint64(out[8:16], c&lo32|f<<32)
			src, out = src[4:], out[16:]
			k += 4
		}
	}
	for ; 4*k < n; k++ {
		v := atomic.LoadUint64(&d[k])
		if v>>32 != e {
			break
		}
		putSlotWord(dst[4*k:min(n, 4*k+4)], v)
	}
	st.Words = k
	return 4*k >= n, nil
}

// checkLen checks the length word lw of a message tagged tag for a load into
// dstLen bytes (see Take).
func (win *SlotWindow) checkLen(peer int, lw uint64, tag uint32, dstLen int, anyLen bool) error {
	n, got := int(lw&slotLenMask), uint32(lw&lo32)>>SlotLenBits
	switch {
	case got != tag:
		return fault.New(fault.ErrMismatch, peer, "%s: small-message exchange (LL) from rank %d: it runs %v, this rank %v: the ranks call different collectives, or in a different order", win.Name, peer, OpKind(got), OpKind(tag))
	case n > win.Bytes:
		return fault.New(fault.ErrMismatch, peer, "%s: small-message exchange (LL) from rank %d: its length word says %d bytes, more than its mailbox (LL slot) holds, %d: the message is corrupt", win.Name, peer, n, win.Bytes)
	case !anyLen && n != dstLen:
		return fault.New(fault.ErrMismatch, peer, "%s: small-message exchange (LL) from rank %d: it sends %d bytes, this rank expects %d: recvCounts must equal what the sender passes in sendCounts", win.Name, peer, n, dstLen)
	case n > dstLen:
		return fault.New(fault.ErrMismatch, peer, "%s: small-message exchange (LL) from rank %d: it sends %d bytes, the receive buffer holds %d", win.Name, peer, n, dstLen)
	}
	return nil
}

// takeFitting copies the data words d that carry epoch e and fit dst, from
// word st.Words on, while the message's length is not known yet (see Take).
func takeFitting(d []uint64, e uint64, dst []byte, anyLen bool, st *SlotLoad) {
	k := st.Words
	need := min(SlotWords(len(dst)), len(d))
	for ; k < need; k++ {
		v := atomic.LoadUint64(&d[k])
		if v>>32 != e {
			break
		}
		if anyLen && (k+1 >= len(d) || atomic.LoadUint64(&d[k+1])>>32 != e) {
			break // may be a shorter message's last, padded word
		}
		putSlotWord(dst[4*k:min(len(dst), 4*k+4)], v)
	}
	st.Words = k
}

// putSlotWord stores the payload bytes of data word v into b (at most 4).
func putSlotWord(b []byte, v uint64) {
	if len(b) == 4 {
		binary.LittleEndian.PutUint32(b, uint32(v))
		return
	}
	for j := range b {
		b[j] = byte(v >> (8 * j))
	}
}
