package dispatch

import "time"

// Segment is a run of received rows: the rows one source rank sent for one
// local expert, in that rank's token order.
type Segment struct {
	// Source is the rank the rows came from.
	Source int
	// Offset is the byte offset of the first row in Handle.Recv, and where
	// the expert outputs for these rows go in the buffer given to Combine.
	Offset int
	// Rows is the number of rows (possibly 0).
	Rows int
}

// Stats describes one step of one rank.
type Stats struct {
	// Tokens is the number of tokens this rank dispatched.
	Tokens int
	// Kept is the number of (token, expert) rows this rank sent, itself included.
	Kept int
	// Dropped is the number of assignments dropped over capacity.
	Dropped int
	// Received is the number of rows this rank received for its experts.
	Received int
	// Imbalance is max/mean of the rows this rank sent per destination rank
	// (1 is even; see routing.Imbalance).
	Imbalance float64
	// CrossHostBytes is the dispatch payload (rows, in the wire format)
	// this rank sent to ranks on other hosts: a row per (token, expert)
	// on the flat path, a row per (token, host) on the relay path.
	CrossHostBytes int64
	// SentBytes and ReceivedBytes are the dispatch payload exchanged with
	// other ranks (the local block and count exchanges are not counted), in
	// the wire format; combine moves the same rows the other way in DType
	// (the same amounts with WireSame, RowBytes/WireRowBytes times more
	// with WireFP8).
	SentBytes, ReceivedBytes int64
	// DispatchTime runs from the start of packing to the end of the
	// exchange; CombineTime from the start of the reverse exchange to the end
	// of the weighted sum.
	DispatchTime, CombineTime time.Duration
}
