package control

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
)

// Every control message travels in a signed envelope:
//
//	version (1) | sender (8) | epoch (4) | seq (8) | msgpack payload | MAC (32)
//
// MAC = HMAC-SHA256(key, len|subject | len|group | everything before the MAC)
// with key = HMAC-SHA256(secret, "a2a control plane v1"): the job's secret,
// the one the data plane authenticates its connections with, under a label of
// its own. The subject binds a message to where it was sent (a counts row
// cannot be replayed as a heartbeat, nor a column meant for one rank delivered
// to another), the group to its job. The sender is the random id of the member
// (its join id) or service that signed it; seq counts that sender's messages
// (1, 2, ...; published in order under one lock) so that a receiver rejects a
// copy of a message it already took; the epoch is the membership epoch (0
// before one exists). Integers are little-endian.
//
// A new message kind is signed by building its bytes with sealed (or the
// codec's begin/end) and publishing them through a signer; a receiver opens
// them with Member.open or Service.open before decoding, which counts every
// rejection. Nothing else may go on the wire.
const (
	envVersion  = 0xA2
	hdrLen      = 1 + 8 + 4 + 8
	macLen      = sha256.Size
	envOverhead = hdrLen + macLen
)

// keyLabel separates the control plane's use of the job secret from the
// data plane's (the TCP hello).
const keyLabel = "a2a control plane v1"

// RejectReason says why a received control message was not believed.
type RejectReason uint8

// The reasons, in the order of Rejects.
const (
	// RejectAuth: the MAC does not match: forged, corrupted in transit,
	// signed with another secret, or not an envelope at all.
	RejectAuth RejectReason = iota
	// RejectReplay: a copy of a message already taken (or older than the
	// replay window) from the same sender on the same subject.
	RejectReplay
	// RejectEpoch: authentic, but of another membership epoch.
	RejectEpoch
	// RejectSender: authentic, but not from a member of the group (or not
	// from the rank it speaks for), or a reply from another coordinator.
	RejectSender
	// RejectMalformed: authentic but undecodable (a bug or a version skew).
	RejectMalformed
	// RejectRate: dropped unread, over the service's message rate
	// (ServiceConfig.MaxRate).
	RejectRate
	numReasons
)

var reasonNames = [numReasons]string{"auth", "replay", "epoch", "sender", "malformed", "rate"}

// String returns the reason's label: auth, replay, epoch, sender, malformed
// or rate.
func (r RejectReason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return "unknown"
}

// Rejects counts rejected control messages, indexed by RejectReason.
type Rejects [numReasons]uint64

// Total is the number of rejected messages.
func (r Rejects) Total() uint64 {
	var n uint64
	for _, v := range r {
		n += v
	}
	return n
}

// rejectCounter counts the messages one party refused, by reason, and logs
// the 1st, 2nd, 4th, 8th... of them to log. Safe for concurrent use.
type rejectCounter struct {
	n   [numReasons]atomic.Uint64
	log *slog.Logger // set at construction
}

// add counts a message rejected on subject for reason r.
func (c *rejectCounter) add(r RejectReason, subject string) {
	c.n[r].Add(1)
	if n := c.snapshot().Total(); n&(n-1) == 0 {
		c.log.Warn("control message rejected", "reason", r.String(), "subject", subject, "rejected", n)
	}
}

func (c *rejectCounter) snapshot() Rejects {
	var r Rejects
	for i := range r {
		r[i] = c.n[i].Load()
	}
	return r
}

// envelope is the authenticated header of a message.
type envelope struct {
	sender uint64
	epoch  uint32
	seq    uint64
}

// deriveKey is the MAC key of a group. Without a secret it derives from the
// group name, as the data plane does: that still catches corruption and
// replays but authenticates nothing, since the name is on every subject.
func deriveKey(secret []byte, group string) []byte {
	if len(secret) == 0 {
		secret = []byte("a2a-group:" + group)
	}
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(keyLabel))
	return h.Sum(nil)
}

// macer computes envelope MACs with one key. It is not safe for concurrent
// use: its owner locks it.
type macer struct {
	h   hash.Hash
	pre []byte // subject and group framing
	sum []byte
}

func newMacer(key []byte) *macer {
	return &macer{h: hmac.New(sha256.New, key), pre: make([]byte, 0, 128), sum: make([]byte, 0, macLen)}
}

// compute returns the MAC of signed (an envelope without its MAC) sent on
// subject for group. The result is valid until the next call.
func (mc *macer) compute(subject, group string, signed []byte) []byte {
	p := mc.pre[:0]
	p = binary.LittleEndian.AppendUint16(p, uint16(len(subject)))
	p = append(p, subject...)
	p = binary.LittleEndian.AppendUint16(p, uint16(len(group)))
	p = append(p, group...)
	mc.pre = p
	mc.h.Reset()
	mc.h.Write(p)
	mc.h.Write(signed)
	mc.sum = mc.h.Sum(mc.sum[:0])
	return mc.sum
}

// seal writes env into msg's header and its MAC into its last macLen bytes.
func (mc *macer) seal(subject, group string, env envelope, msg []byte) {
	msg[0] = envVersion
	binary.LittleEndian.PutUint64(msg[1:], env.sender)
	binary.LittleEndian.PutUint32(msg[9:], env.epoch)
	binary.LittleEndian.PutUint64(msg[13:], env.seq)
	n := len(msg) - macLen
	copy(msg[n:], mc.compute(subject, group, msg[:n]))
}

// open checks data's MAC for subject and group and returns its envelope and
// payload (aliasing data).
func (mc *macer) open(subject, group string, data []byte) (env envelope, payload []byte, ok bool) {
	if len(data) < envOverhead || data[0] != envVersion || len(subject) > 0xffff || len(group) > 0xffff {
		return env, nil, false
	}
	n := len(data) - macLen
	if !hmac.Equal(mc.compute(subject, group, data[:n]), data[n:]) {
		return env, nil, false
	}
	env.sender = binary.LittleEndian.Uint64(data[1:])
	env.epoch = binary.LittleEndian.Uint32(data[9:])
	env.seq = binary.LittleEndian.Uint64(data[13:])
	return env, data[hdrLen:n], true
}

// macSet holds the macers of the groups one party signs or verifies for: one
// for all when a secret is set, else one per group. Its owner locks it.
type macSet struct {
	secret  []byte
	one     *macer
	byGroup map[string]*macer
}

func newMacSet(secret []byte) *macSet {
	s := &macSet{secret: secret}
	if len(secret) > 0 {
		s.one = newMacer(deriveKey(secret, ""))
	}
	return s
}

func (s *macSet) get(group string) *macer {
	if s.one != nil {
		return s.one
	}
	if mc := s.byGroup[group]; mc != nil {
		return mc
	}
	if s.byGroup == nil || len(s.byGroup) >= 1024 {
		s.byGroup = make(map[string]*macer) // groups come and go: start over
	}
	mc := newMacer(deriveKey(nil, group))
	s.byGroup[group] = mc
	return mc
}

// sealed returns a message with payload p and room for the envelope.
func sealed(p []byte) []byte {
	msg := make([]byte, hdrLen+len(p)+macLen)
	copy(msg[hdrLen:], p)
	return msg
}

// signer signs and publishes one sender's messages. Sequence numbers are
// assigned and the messages published under one lock, so they leave in
// sequence order whichever goroutine sends them.
type signer struct {
	mu   sync.Mutex
	id   uint64
	seq  uint64
	macs *macSet
}

func newSigner(id uint64, secret []byte) *signer {
	return &signer{id: id, macs: newMacSet(secret)}
}

// publish seals msg (built by sealed or the codec) for subj and group and
// publishes it, with reply as the reply subject when not empty.
func (s *signer) publish(nc *nats.Conn, subj, reply, group string, epoch uint32, msg []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	s.macs.get(group).seal(subj, group, envelope{sender: s.id, epoch: epoch, seq: s.seq}, msg)
	if reply == "" {
		return nc.Publish(subj, msg)
	}
	return nc.PublishRequest(subj, reply, msg)
}

// verifier opens received messages and refuses copies of ones it already
// took. It is not safe for concurrent use: its owner locks it.
type verifier struct {
	macs *macSet
	seen replays
}

func newVerifier(secret []byte) verifier {
	return verifier{macs: newMacSet(secret), seen: make(replays)}
}

// check authenticates data, received on subject, as a message of group and
// takes it unless it is a copy of one already taken. When it refuses the
// message it says why.
func (v *verifier) check(subject, group string, data []byte) (env envelope, payload []byte, why RejectReason, ok bool) {
	env, payload, ok = v.macs.get(group).open(subject, group, data)
	switch {
	case !ok:
		return env, nil, RejectAuth, false
	case !v.seen.fresh(env.sender, subject, env.seq):
		return env, nil, RejectReplay, false
	}
	return env, payload, 0, true
}

// replayWindow is how far behind the newest sequence number of a sender on a
// subject an unseen one is still taken: messages of one sender to one
// subscription arrive in order, but the readers of a shared channel may open
// them a little out of order.
const replayWindow = 64

type replayKey struct {
	sender  uint64
	subject string
}

type window struct {
	max  uint64
	seen uint64 // bit i: max-i was taken
}

// replays remembers which sequence numbers were taken, per sender and
// subject. Its owner locks it.
type replays map[replayKey]window

// fresh reports whether seq from sender on subject was not taken before, and
// records it.
func (r replays) fresh(sender uint64, subject string, seq uint64) bool {
	k := replayKey{sender, subject}
	w, ok := r[k]
	switch {
	case !ok || seq > w.max:
		if d := seq - w.max; !ok || d >= 64 {
			w.seen = 1
		} else {
			w.seen = w.seen<<d | 1
		}
		w.max = seq
	case w.max-seq >= replayWindow:
		return false
	default:
		bit := uint64(1) << (w.max - seq)
		if w.seen&bit != 0 {
			return false
		}
		w.seen |= bit
	}
	r[k] = w
	return true
}

// forget drops the windows of senders keep does not report.
func (r replays) forget(keep func(sender uint64) bool) {
	for k := range r {
		if !keep(k.sender) {
			delete(r, k)
		}
	}
}
