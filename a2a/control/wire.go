package control

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

const (
	subjPrefix = "a2a."
	svcPrefix  = "a2a.svc."

	opPing   = "ping"
	opClaim  = "claim"
	opJoin   = "join"
	opCounts = "counts"
	opHB     = "hb"
	opAbort  = "abort"
	opLeave  = "leave"
)

func svcSubject(group, op string) string   { return svcPrefix + group + "." + op }
func groupSubject(group, op string) string { return subjPrefix + group + "." + op }

// InboxPrefix is the inbox prefix (nats.CustomInboxPrefix) of the
// connections of group's ranks, so that replies to them stay under subjects a
// NATS account can grant to that group alone (see Subjects).
func InboxPrefix(group string) string { return "_INBOX." + group }

// Subjects are the subjects, with wildcards, that a member of group publishes
// and subscribes to when its connection uses InboxPrefix(group): the group's
// own subjects, its coordinator's, and its inboxes. A NATS user allowed
// exactly these (publish and subscribe) can run a job of group, hosting its
// coordinator too, and reach no other group. The group subjects are matched
// with one token (not a2a.G.>) because a group named "svc" would otherwise
// reach every group's coordinator subjects.
func Subjects(group string) []string {
	return []string{subjPrefix + group + ".*", svcPrefix + group + ".*", InboxPrefix(group) + ".>"}
}

// groupOfSvc extracts G from "a2a.svc.G.op" without allocating.
func groupOfSvc(subject, op string) string {
	if len(subject) < len(svcPrefix)+len(op)+2 {
		return ""
	}
	return subject[len(svcPrefix) : len(subject)-len(op)-1]
}

// splitGroupSubject splits "a2a.G.op" into G and op.
func splitGroupSubject(subject string) (group, op string) {
	if len(subject) <= len(subjPrefix) {
		return "", ""
	}
	rest := subject[len(subjPrefix):]
	for i := len(rest) - 1; i >= 0; i-- {
		if rest[i] == '.' {
			return rest[:i], rest[i+1:]
		}
	}
	return "", ""
}

// validToken reports whether s can be used as one NATS subject token.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '.' || c == '*' || c == '>' || c <= ' ' || c == 0x7f {
			return false
		}
	}
	return true
}

// Kinds travel as small integers; index 0 means "no error".
var kindTable = [...]error{nil, fault.ErrInvalidArgument, fault.ErrMismatch, fault.ErrPeerLost,
	fault.ErrAborted, fault.ErrTimeout, fault.ErrClosed, fault.ErrAuth, fault.ErrResource}

func kindCode(kind error) uint8 {
	for i, k := range kindTable {
		if i > 0 && k == kind {
			return uint8(i)
		}
	}
	return 4 // unknown causes travel as a plain abort
}

func kindOfCode(c uint8) error {
	if c > 0 && int(c) < len(kindTable) {
		return kindTable[c]
	}
	return fault.ErrAborted
}

// describe reduces a cause to what travels on the wire: its kind, the rank the
// matching *fault.Error concerns and a detail.
func describe(cause error) (kind error, rank int, detail string) {
	kind = fault.KindOf(cause)
	if kind == nil {
		kind = fault.ErrAborted
	}
	rank = -1
	for e := cause; e != nil; e = errors.Unwrap(e) {
		if fe, ok := e.(*fault.Error); ok && fe.Kind == kind {
			rank, detail = fe.Rank, fe.Detail
			if fe.Err != nil && fault.KindOf(fe.Err) == nil {
				detail += ": " + fe.Err.Error()
			}
			return kind, rank, detail
		}
	}
	if cause != nil {
		detail = cause.Error()
	}
	return kind, rank, detail
}

// maxNesting bounds how deeply a received message may nest arrays and maps;
// ours nest four levels (a formed reply's node's transport addresses).
const maxNesting = 16

// unmarshal decodes a received msgpack message into v, after checkBounds:
// msgpack v5.4.1 sizes a slice by the length a message declares, whatever
// the bytes that follow, so eight bytes declaring 2^28 nodes had it
// allocate tens of gigabytes. Errors match fault.ErrMismatch.
func unmarshal(p []byte, v any) error {
	if err := checkBounds(p); err != nil {
		return err
	}
	if err := msgpack.Unmarshal(p, v); err != nil {
		return fault.Wrap(fault.ErrMismatch, -1, err, "control: malformed message")
	}
	return nil
}

// checkBounds walks the first msgpack value of p without decoding it and
// refuses one that declares more elements or bytes than p holds (every
// element takes at least one byte) or nests deeper than maxNesting.
func checkBounds(p []byte) error {
	bad := func(format string, args ...any) error {
		return fault.New(fault.ErrMismatch, -1, "control: malformed message: "+format, args...)
	}
	var left [maxNesting + 1]int // elements still to read, by nesting level
	depth := 0
	left[0] = 1
	for pos := 0; ; {
		for depth > 0 && left[depth] == 0 {
			depth--
		}
		if left[depth] == 0 {
			return nil
		}
		left[depth]--
		if pos >= len(p) {
			return bad("ends after %d bytes", pos)
		}
		c := p[pos]
		f := msgpackFormats[c]
		if !f.valid {
			return bad("byte %#x at offset %d", c, pos)
		}
		pos++
		n := int(c & f.lenBits)
		if f.lenWidth > 0 {
			if len(p)-pos < f.lenWidth {
				return bad("ends inside a length")
			}
			n = bigEndian(p[pos : pos+f.lenWidth])
			pos += f.lenWidth
		}
		skip, elems := f.fixed, 0 // bytes to skip, elements that follow
		if f.perLen == 0 {
			skip += n
		} else {
			elems = f.perLen * n
		}
		if skip > len(p)-pos {
			return bad("%d bytes declared at offset %d, %d left", skip, pos, len(p)-pos)
		}
		pos += skip
		if elems > 0 {
			if elems > len(p)-pos {
				return bad("%d elements declared at offset %d, %d bytes left", elems, pos, len(p)-pos)
			}
			if depth == maxNesting {
				return bad("nested deeper than %d", maxNesting)
			}
			depth++
			left[depth] = elems
		}
	}
}

// bigEndian reads b as an unsigned big-endian integer (at most four bytes).
func bigEndian(b []byte) int {
	n := 0
	for _, x := range b {
		n = n<<8 | int(x)
	}
	return n
}

// msgpackFormat says how far a msgpack value reaches, by its first byte: a
// length n, taken from the byte's low bits (lenBits) or from the lenWidth
// bytes that follow it (big-endian), counts bytes (perLen 0), elements
// (perLen 1) or key-value pairs (perLen 2); fixed more bytes follow
// whatever the length (a number's, an ext's type).
type msgpackFormat struct {
	valid    bool
	lenBits  byte
	lenWidth int
	perLen   int
	fixed    int
}

// msgpackFormats describes every first byte of a msgpack value (the
// specification's format table). Read-only.
var msgpackFormats = msgpackFormatTable()

func msgpackFormatTable() [256]msgpackFormat {
	var t [256]msgpackFormat
	set := func(from, to int, f msgpackFormat) {
		f.valid = true
		for c := from; c <= to; c++ {
			t[c] = f
		}
	}
	set(0x00, 0x7f, msgpackFormat{})                         // positive fixint
	set(0x80, 0x8f, msgpackFormat{lenBits: 0x0f, perLen: 2}) // fixmap
	set(0x90, 0x9f, msgpackFormat{lenBits: 0x0f, perLen: 1}) // fixarray
	set(0xa0, 0xbf, msgpackFormat{lenBits: 0x1f})            // fixstr
	set(0xc0, 0xc0, msgpackFormat{})                         // nil; 0xc1 is never used
	set(0xc2, 0xc3, msgpackFormat{})                         // false, true
	for i, w := range []int{1, 2, 4} {
		set(0xc4+i, 0xc4+i, msgpackFormat{lenWidth: w})           // bin8/16/32
		set(0xc7+i, 0xc7+i, msgpackFormat{lenWidth: w, fixed: 1}) // ext8/16/32: length, type, data
		set(0xd9+i, 0xd9+i, msgpackFormat{lenWidth: w})           // str8/16/32
	}
	set(0xca, 0xca, msgpackFormat{fixed: 4}) // float32
	set(0xcb, 0xcb, msgpackFormat{fixed: 8}) // float64
	for i, w := range []int{1, 2, 4, 8} {
		set(0xcc+i, 0xcc+i, msgpackFormat{fixed: w}) // uint8..64
		set(0xd0+i, 0xd0+i, msgpackFormat{fixed: w}) // int8..64
	}
	for i := range 5 {
		set(0xd4+i, 0xd4+i, msgpackFormat{fixed: 1 + 1<<i}) // fixext1..16: type and data
	}
	set(0xdc, 0xdc, msgpackFormat{lenWidth: 2, perLen: 1}) // array16
	set(0xdd, 0xdd, msgpackFormat{lenWidth: 4, perLen: 1}) // array32
	set(0xde, 0xde, msgpackFormat{lenWidth: 2, perLen: 2}) // map16
	set(0xdf, 0xdf, msgpackFormat{lenWidth: 4, perLen: 2}) // map32
	set(0xe0, 0xff, msgpackFormat{})                       // negative fixint
	return t
}

type pingMsg struct {
	ID string `msgpack:"id"`
}

type claimMsg struct {
	ID     string `msgpack:"id"`
	Nonce  uint64 `msgpack:"n"`
	Exists bool   `msgpack:"x"`
}

type joinReq struct {
	ID        string   `msgpack:"id"`
	Rank      int      `msgpack:"r"`
	World     int      `msgpack:"w"`
	Streams   int      `msgpack:"s"`
	TimeoutMS int64    `msgpack:"t"`
	Withdraw  bool     `msgpack:"wd"`
	Info      NodeInfo `msgpack:"i"`
}

const (
	stAck uint8 = iota + 1
	stFormed
	stFail
)

type joinResp struct {
	Status     uint8      `msgpack:"st"`
	Service    string     `msgpack:"svc"`
	Epoch      uint32     `msgpack:"e"`
	World      int        `msgpack:"w"`
	IDs        []string   `msgpack:"ids"` // formed: join ID of every rank
	Nodes      []NodeInfo `msgpack:"n"`
	Joined     []int      `msgpack:"j"` // ack: explicit ranks present so far
	Unassigned int        `msgpack:"u"` // ack: joiners awaiting assignment
	Busy       uint32     `msgpack:"b"` // ack: held while formation Busy (an epoch) lasts
	Kind       uint8      `msgpack:"k"`
	Detail     string     `msgpack:"d"`
}

type hbMsg struct {
	_msgpack struct{} `msgpack:",as_array"`
	Epoch    uint32
	Rank     int
}

type abortMsg struct {
	_msgpack struct{} `msgpack:",as_array"`
	Epoch    uint32
	Origin   int
	Kind     uint8
	Rank     int
	Detail   string
	From     uint64 // the first operation sequence the abort concerns (Member.AbortAt)
	// Comm is the communicator whose scope the abort concerns: 0 for the
	// group's, another for a Scope's (Comm.Split, Comm.Dup).
	Comm uint16
}

type leaveMsg struct {
	_msgpack struct{} `msgpack:",as_array"`
	Epoch    uint32
	Rank     int
	From     uint64 // the first operation sequence the leaver takes no part in (Member.LeaveAt)
}

// codec is a pooled encoder/decoder pair for the counts hot path, so that an
// exchange in steady state does not allocate for encoding or decoding.
type codec struct {
	buf bytes.Buffer
	enc *msgpack.Encoder
	rd  bytes.Reader
	dec *msgpack.Decoder
	tmp []byte
}

// scratch returns a reusable n-byte buffer.
func (c *codec) scratch(n int) []byte {
	if cap(c.tmp) < n {
		c.tmp = make([]byte, n)
	}
	return c.tmp[:n]
}

var codecPool = sync.Pool{New: func() any {
	c := &codec{}
	c.enc = msgpack.NewEncoder(&c.buf)
	c.dec = msgpack.NewDecoder(&c.rd) // bytes.Reader is a ByteScanner: no extra buffering
	return c
}}

func getCodec() *codec  { c := codecPool.Get().(*codec); c.buf.Reset(); return c }
func putCodec(c *codec) { c.rd.Reset(nil); codecPool.Put(c) }

// appendInts writes v as a msgpack bin of little-endian int64s.
func (c *codec) appendInts(v []int) {
	_ = c.enc.EncodeBytesLen(len(v) * 8)
	c.buf.Grow(len(v) * 8)
	b := c.buf.AvailableBuffer()
	for _, x := range v {
		b = binary.LittleEndian.AppendUint64(b, uint64(int64(x)))
	}
	c.buf.Write(b)
}

// Row: [epoch, seq, rank, flags, bin counts].
const rowWantMatrix = 1

// begin starts a message: room for the envelope header, then the payload.
func (c *codec) begin() {
	c.buf.Reset()
	c.buf.Write(zeros[:hdrLen])
}

// zeros fills the room reserved for the envelope.
var zeros [max(hdrLen, macLen)]byte

// end reserves the MAC and returns the message for a signer.
func (c *codec) end() []byte {
	c.buf.Write(zeros[:macLen])
	return c.buf.Bytes()
}

func (c *codec) encodeRow(epoch uint32, seq uint64, rank int, flags uint8, counts []int) []byte {
	c.begin()
	_ = c.enc.EncodeArrayLen(5)
	_ = c.enc.EncodeUint(uint64(epoch))
	_ = c.enc.EncodeUint(seq)
	_ = c.enc.EncodeUint(uint64(rank))
	_ = c.enc.EncodeUint(uint64(flags))
	c.appendInts(counts)
	return c.end()
}

type row struct {
	epoch  uint32
	seq    uint64
	rank   int
	flags  uint8
	counts []byte // aliases the message
}

func (c *codec) decodeRow(data []byte) (r row, err error) {
	c.rd.Reset(data)
	n, err := c.dec.DecodeArrayLen()
	if err != nil {
		return r, err
	}
	if n != 5 {
		return r, fmt.Errorf("counts row: %d fields", n)
	}
	e, err := c.dec.DecodeUint64()
	if err != nil {
		return r, err
	}
	if r.seq, err = c.dec.DecodeUint64(); err != nil {
		return r, err
	}
	rk, err := c.dec.DecodeUint64()
	if err != nil {
		return r, err
	}
	fl, err := c.dec.DecodeUint64()
	if err != nil {
		return r, err
	}
	r.epoch, r.rank, r.flags = uint32(e), int(rk), uint8(fl)
	r.counts, err = c.bin(data)
	return r, err
}

// bin decodes a msgpack bin (or nil) as a slice of data, without copying.
func (c *codec) bin(data []byte) ([]byte, error) {
	n, err := c.dec.DecodeBytesLen()
	if err != nil || n < 0 {
		return nil, err
	}
	pos := len(data) - c.rd.Len()
	if pos+n > len(data) {
		return nil, io.ErrUnexpectedEOF
	}
	_, _ = c.rd.Seek(int64(n), io.SeekCurrent)
	return data[pos : pos+n], nil
}

// Column reply: [seq, epoch, kind, rank, detail, bin column|nil, bin matrix|nil].
// seq comes first so a receiver can route the message before decoding it.
func (c *codec) encodeCol(seq uint64, epoch uint32, col, mat []byte) []byte {
	c.begin()
	_ = c.enc.EncodeArrayLen(7)
	_ = c.enc.EncodeUint(seq)
	_ = c.enc.EncodeUint(uint64(epoch))
	_ = c.enc.EncodeUint(0)
	_ = c.enc.EncodeInt(-1)
	_ = c.enc.EncodeString("")
	_ = c.enc.EncodeBytes(col)
	if mat != nil {
		_ = c.enc.EncodeBytes(mat)
	} else {
		_ = c.enc.EncodeNil()
	}
	return c.end()
}

func (c *codec) encodeColErr(seq uint64, epoch uint32, kind error, rank int, detail string) []byte {
	c.begin()
	_ = c.enc.EncodeArrayLen(7)
	_ = c.enc.EncodeUint(seq)
	_ = c.enc.EncodeUint(uint64(epoch))
	_ = c.enc.EncodeUint(uint64(kindCode(kind)))
	_ = c.enc.EncodeInt(int64(rank))
	_ = c.enc.EncodeString(detail)
	_ = c.enc.EncodeNil()
	_ = c.enc.EncodeNil()
	return c.end()
}

// peekSeq reads a column reply's seq and error kind (0: a column).
func (c *codec) peekSeq(data []byte) (seq, kind uint64, err error) {
	c.rd.Reset(data)
	if _, err = c.dec.DecodeArrayLen(); err != nil {
		return 0, 0, err
	}
	if seq, err = c.dec.DecodeUint64(); err != nil {
		return 0, 0, err
	}
	if _, err = c.dec.DecodeUint64(); err != nil {
		return 0, 0, err
	}
	kind, err = c.dec.DecodeUint64()
	return seq, kind, err
}

type colReply struct {
	seq    uint64
	epoch  uint32
	kind   uint8
	rank   int
	detail string
	col    []byte
	mat    []byte
}

func (c *codec) decodeCol(data []byte) (r colReply, err error) {
	c.rd.Reset(data)
	n, err := c.dec.DecodeArrayLen()
	if err != nil {
		return r, err
	}
	if n != 7 {
		return r, fmt.Errorf("counts reply: %d fields", n)
	}
	if r.seq, err = c.dec.DecodeUint64(); err != nil {
		return r, err
	}
	e, err := c.dec.DecodeUint64()
	if err != nil {
		return r, err
	}
	k, err := c.dec.DecodeUint64()
	if err != nil {
		return r, err
	}
	rk, err := c.dec.DecodeInt64()
	if err != nil {
		return r, err
	}
	r.epoch, r.kind, r.rank = uint32(e), uint8(k), int(rk)
	if k != 0 {
		if r.detail, err = c.dec.DecodeString(); err != nil {
			return r, err
		}
	} else if err = c.dec.Skip(); err != nil {
		return r, err
	}
	if r.col, err = c.bin(data); err != nil {
		return r, err
	}
	r.mat, err = c.bin(data)
	return r, err
}

func getInts(dst []int, b []byte) {
	for i := range dst {
		dst[i] = int(int64(binary.LittleEndian.Uint64(b[i*8:])))
	}
}
