// Package dispatch is the MoE dispatch and combine layer on top of an
// [a2a.Comm]: it sends every token row to the ranks that host the experts the
// router chose for it, hands each local expert its rows, and brings the expert
// outputs back, summed with the gate weights in the original token order.
//
// One layer step on every rank of the group:
//
//	h, err := d.Dispatch(ctx, tokens, &decision) // capacity -> counts -> AllToAllVSpans or shared memory
//	for l := range h.LocalExperts() {
//		for _, seg := range h.Segments(l) {           // rows of local expert l, by source rank
//			in := h.Recv()[seg.Offset : seg.Offset+seg.Rows*rowBytes]
//			out := h.Output()[seg.Offset : seg.Offset+seg.Rows*rowBytes]
//			expert(h.Expert(l), in, out) // reduce.Float32s(in) views the rows as floats
//		}
//	}
//	err = d.Combine(ctx, h, h.Output(), combined) // reverse AllToAllV or shared memory -> weighted sum
//	h.Release()
//
// # What Dispatch does
//
// [Dispatcher.Dispatch] copies the caller's [routing.Decision], enforces the
// capacity factor on the copy ([routing.Capacity]: each rank keeps at most
// ceil(T*k/E*factor) of its own T tokens' assignments per expert, dropping the
// lowest gate weights), builds the permutation ([routing.Plan]: rows grouped by
// destination rank, then expert, then token), copies the token rows into that
// order, tells every rank how many rows it will get for each of its local
// experts, and exchanges the rows in one collective. With [CountsInBand] (the
// default) that is an [a2a.Comm.AllToAllVSpans] straight from the caller's
// tokens: each destination's rows go out as a gather list of spans of the
// token buffer, in the permuted order, and nothing is packed. With
// [CountsNATS] every block starts with a row-count header, so the rows are
// first packed behind their headers into a send buffer and sent by one
// [a2a.Comm.AllToAllV]. Rows for this rank's own experts stay out of the
// collective in both modes: they are copied once, straight from the tokens
// to the front of the receive buffer. The copies walk the tokens in order,
// so each token row is read once for all its k destinations, and for steps
// of 1 MiB or more they use streaming (non-temporal) stores, as Go's memmove
// does for large copies: the packed rows are read next by the peers, not by
// this core, so reading their old contents into the cache first would only
// add memory traffic.
//
// # Same host: shared memory instead of AllToAllV
//
// Between two ranks of one host ([a2a.Comm.Host]) that can map each other's
// memory, [RowsAuto] (the default; see [Dispatcher.SharedWith]) moves rows
// without any AllToAllV: each handle's receive and output buffers are memfd
// segments that the other ranks of the host map through /proc/<pid>/fd. This
// is what DeepEP's intranode kernels do over NVLink:
//
//   - Dispatch, after the counts, exchanges 48-byte segment descriptors (each
//     receiver says where each sender's block goes) and packs every row for
//     such a peer straight into that peer's receive buffer: one copy per row
//     instead of a pack plus the exchange's copy. Rows for other hosts travel
//     by the exchange described above; its message from every peer
//     (every pair exchanges one, empty or not) also says that the peer's rows
//     are in place, and a group on one host uses a barrier instead.
//   - Combine exchanges descriptors of the expert outputs (which also says
//     "outputs ready") and computes the weighted sums reading same-host
//     peers' outputs where their experts wrote them: those rows are not
//     copied at all. The reverse AllToAllV, or a barrier on one host, first
//     makes sure every rank has mapped what it reads, so a rank may close
//     its dispatcher or exit as soon as its combine returns.
//
// Outputs computed into a buffer of the caller's (neither Recv nor Output)
// are first copied into shared memory. A memfd disappears with the last
// process that maps it, so a killed rank leaves nothing behind in /dev/shm.
// A failure to create or map a segment after [New] aborts the Comm (the
// peers' step cannot complete without this rank's part; they see
// [a2a.ErrAborted]). Ranks that force A2A_TRANSPORT=tcp, or a layer with
// [RowsAllToAllV], use the AllToAllV path described next and below for every
// pair. The choice of every pair is made once, collectively, in [New] (each
// rank maps a probe segment of every same-host rank and reads it back), so
// every rank runs the same collectives.
//
// # FP8 wire
//
// With [Config.Wire] set to [WireFP8], rows travel as DeepEP dispatches
// them: OCP FP8 E4M3 (e4m3fn, saturating at ±448) with one float32 scale
// per [reduce.E4M3Block] (128) elements of a row, scale = amax/448, so each
// block uses the whole E4M3 range. A wire row is the row's Hidden E4M3
// bytes followed by its little-endian scales: at H=7168, 7392 bytes
// instead of 14336 in bfloat16 (0.52x). Each token row is quantized once,
// before the counts exchange (without shared memory, in the pass that packs
// the rows), into a staging buffer of wire rows that the
// AllToAllVSpans gathers from and the shared-memory pack copies from (into
// each same-host receiver's wire buffer); this rank's own rows take the same
// round trip, so what an expert sees does not depend on where it runs. On
// arrival the rows are dequantized into [Handle.Recv] in [Config.DType]
// (float32 or bfloat16), laid out as always; with [Config.KeepFP8], Recv
// holds the E4M3 bytes (Hidden per row, same order) and [Handle.Scales]
// the scales, for experts that compute in FP8. Each element comes back
// within |x|/16 plus half the smallest subnormal step of its block
// (scale*2^-10). Combine is unchanged: outputs travel in DType and are
// summed in float32. A row of zeros gets scale 0. A row holding Inf or NaN
// cannot be scaled: Dispatch fails with [a2a.ErrInvalidArgument] naming
// the token on its rank, and, because that rank marks its in-band counts
// block as rejected, with [a2a.ErrAborted] naming it on every other rank at
// once; nobody exchanges rows for that step, and the Comm stays usable.
// WireFP8 needs [CountsInBand].
//
// # Learning the receive counts
//
// A receiver needs more than the byte count of each incoming block: it must
// know how many rows of the block belong to each of its local experts. Two
// modes, chosen by [Config.Counts]:
//
//   - [CountsInBand] (default): one fixed-size [a2a.Comm.AllToAll] carries, for
//     every (destination rank, local expert), the row count as a uint32, then
//     the sender's rows of its previous dispatch per slot of its own (for
//     [Dispatcher.Load]) — a block of 8*maxLocalExperts bytes per peer, local
//     experts counting replicas. Byte counts follow from row
//     counts, so this single small exchange replaces the per-rank counts
//     exchange entirely, and the data blocks carry rows only, so a rank's
//     received buffer is nothing but rows. It runs on the data plane: at 2
//     ranks an in-band counts exchange costs about 9 us, a NATS round trip
//     between processes about 160 us, and MoE steps are latency-bound at small
//     batch sizes.
//   - [CountsNATS]: byte counts through the control plane
//     ([a2a.Comm.ExchangeCountsMatrix]), and the per-expert row counts as a
//     header at the front of each block (4 bytes per local expert of the
//     destination, then 4*maxLocalExperts bytes of the sender's previous
//     rows for Load, padded to [HeaderAlign] bytes so rows stay aligned). Every
//     rank also learns the whole traffic matrix. It allocates (NATS messages)
//     and is slower; it exists for deployments that want the control plane to
//     see every step's traffic.
//
// In both modes [Handle.Segments] gives the byte offsets of each (local expert,
// source rank) run of rows, so callers need not know the layout.
//
// # Combine
//
// Without shared memory, [Dispatcher.Combine] runs the reverse AllToAllV with the dispatch counts
// swapped — no second counts exchange — into the dispatch's send buffer,
// which then holds the other ranks' expert outputs in the permuted order (the
// outputs for this rank's own rows are read where the experts wrote them),
// and forms, for every token t, out[t] = sum over its kept slots s (in slot
// order) of weight[t,s] * output[row(t,s)] in float32, rounded once to the
// layer's element type. Each product and partial sum is rounded to float32
// (no fused multiply-add), so results are the same on every architecture; on
// amd64 with AVX2 the top-1 and top-2 cases run in vector kernels (512-bit
// for top-2 bfloat16 on cores with AVX-512 VBMI2; build tag purego disables
// them all). For outputs of 1 MiB or more, the rows of the next token are
// prefetched while one is summed and the sums are written with streaming
// stores. A dropped assignment contributes nothing, and a
// token whose assignments were all dropped gets a zero row: the caller's
// residual connection carries it (the usual MoE convention; weights are not
// renormalised after drops). The expert outputs must be laid out like
// [Handle.Recv]; computing them in place into Recv is allowed.
//
// # Replicas, load and re-placement
//
// A [routing.Placement] may give an expert several physical slots, its
// replicas ([routing.Balance] computes such placements). Each kept (token,
// expert) assignment goes to exactly one replica, chosen by the sender alone,
// deterministically: the replica on this rank if there is one, else those on
// this rank's host, else all of them, spread evenly by token index (token t
// of rank r takes replica (t+r) mod n of those n). Internally every filled
// slot is a destination of its own, so the permutation, the counts and
// Combine work on slots as they do on experts, and Combine takes each
// assignment's output from the replica that computed it. A rank's local
// slot l is its l-th filled slot (slot r*SlotsPerRank()+l for the
// placements routing builds) and [Handle.Expert](l) is its logical expert:
// the expert code does not change. A placement without replicas behaves as
// before.
//
// [Dispatcher.Load] estimates each logical expert's rows per dispatch over
// the group, a moving average that is the same on every rank. It costs no
// collective: the in-band counts block (or the CountsNATS block header) also
// carries the sender's rows of its previous dispatch for each of its slots,
// so the estimate trails by one dispatch.
//
// [Dispatcher.Replace] is a collective between steps that switches the layer
// to a new placement and moves the parameters of every changed slot's expert
// over the data plane (one AllToAllV), through the caller's [ExpertMover]:
// a fingerprint exchange first refuses a placement the ranks disagree on
// ([a2a.ErrMismatch]), and a vote after the moves makes every rank switch or
// none (a failed import, or a rank lost before its vote, leaves every rank
// on the old placement with a typed error; after a rank lost while voting,
// the survivors call [Dispatcher.Settle] on the shrunk Comm, which puts them
// all on one placement). [Dispatcher.LastReplace] reports
// the bytes and the time. [Config.Rebalance] runs it inside Dispatch every
// Every dispatches when the estimated max/mean rank load exceeds Threshold,
// placing with routing.Balance over Experts+Redundant slots.
//
// # Asynchronous steps
//
// A Comm runs one collective at a time, so overlap comes from the caller:
// [Dispatcher.DispatchAsync] and [Dispatcher.CombineAsync] validate and plan
// on the calling goroutine, hand the packing and the exchange to the
// dispatcher's single worker goroutine and return at once; [Handle.Wait]
// blocks until that step is done. The expert compute of one micro-batch then
// runs while the next one is in flight:
//
//	h0, _ := d.Dispatch(ctx, tok0, &dec0)
//	h1, _ := d.DispatchAsync(ctx, tok1, &dec1) // exchange of micro-batch 1 ...
//	compute(h0)                                // ... overlaps compute of 0
//	h1.Wait()
//	d.CombineAsync(ctx, h0, h0.Output(), out0) // combine of 0 ...
//	compute(h1)                                // ... overlaps compute of 1
//	h0.Wait()
//	d.Combine(ctx, h1, h1.Output(), out1)
//
// The worker runs operations in submission order, which is what keeps the
// ranks' collectives in the same order. The synchronous forms run on the
// calling goroutine when nothing is queued, and behind the queued operations
// otherwise.
//
// # Decode mode
//
// Decode steps carry few tokens (1-128 per rank), so the counts exchange and
// the per-step collectives, not the bytes, set their time. With
// [Config.MaxTokens] > 0 the dispatcher runs the low-latency mode of
// DeepEP's and pplx's decode kernels: at New every rank lays out two fixed
// buffer sets, each with one block per source rank of room for its worst
// case (MaxTokens*min(K, slots) rows), and the per-slot row counts travel
// in front of each block, in the same round as the rows. Between ranks of a
// host the sets are memfd segments the peers map once: a sender writes its
// rows and counts into the receiver's block and stores the step number in a
// flag word the receiver polls; combine publishes a ready word and the
// senders read the outputs where the experts wrote them (Output, or Recv
// computed in place). Other pairs send the block and the outputs as
// point-to-point messages. Consecutive steps alternate the two sets, so no
// barrier sits between steps: a rank writes into a peer's set only once the
// peer's ready word says the step before last is done there.
//
// The split form overlaps two micro-batches on one goroutine:
//
//	h0, _ := d.DispatchSend(ctx, tok0, &dec0) // rows of 0 posted
//	h1, _ := d.DispatchSend(ctx, tok1, &dec1) // rows of 1 posted
//	h0.Wait()                                 // rows of 0 received
//	compute(h0)
//	d.CombineSend(ctx, h0, h0.Output(), out0)
//	h1.Wait()
//	compute(h1)
//	d.CombineSend(ctx, h1, h1.Output(), out1)
//	h0.Wait(); h1.Wait()                      // out0, out1 summed
//	h0.Release(); h1.Release()                // before the next step's DispatchSend
//
// Dispatch, DispatchAsync, Combine and CombineAsync work unchanged in the
// mode (the synchronous forms are the split ones plus Wait), and the
// handle's accessors mean the same: Recv is the handle's fixed buffer, its
// blocks in source rank order with room between them, and Segments say
// where the rows are. At most two steps are held at once (the handle of
// the step before last must be released first); a step over MaxTokens is
// [a2a.ErrInvalidArgument] before anything is sent. Every rank makes the
// same calls in the same order, and combines every step or none. Not with
// [CountsNATS] or [Config.Rebalance] (nor [Dispatcher.Replace]): the
// buffers are laid out for one placement; [Dispatcher.Load] is not updated.
// A wait fails with the Comm's abort, the context's end or after the
// Comm's timeout, and aborts the Comm so that no peer waits for this rank.
//
// # Steady state
//
// Handles come from a per-dispatcher free list ([Handle.Release] returns
// them) and keep their buffers, which only grow. A released handle's
// accessors return nil (or 0) until it is handed out again, so a stale use
// shows instead of reading a later step's rows; the worker and its
// completion channels are created once. Once the buffers have reached the
// step's size, a step allocates nothing in [CountsInBand] mode (the package's
// tests check it with runtime.MemStats, as the a2a package does).
//
// # Performance
//
// Beyond moving the rows, a step costs one rank: the gate's top-k (the
// caller's), copying the decision and planning (O(tokens*k)), one in-band
// counts exchange, and the weighted sum, which reads every expert output once
// and writes every token once; with [CountsNATS], also one extra copy of every
// row sent to another rank (the pack behind the headers; in-band counts send
// rows from the tokens as they are). BenchmarkLocalCost measures these alone for
// 4096 tokens of 1024 bf16 elements, 16 experts, top-2; BenchmarkOverhead
// compares whole steps with two plain AllToAllV of the same bytes (forward
// with the local block, which Dispatch copies too; reverse without it, which
// Combine reads in place). Between ranks of one host an AllToAllV is itself a
// single memory copy (process_vm_readv), so with the AllToAllV path the
// weighted sum (and the pack, with CountsNATS), which move about as many
// bytes again, weigh far more
// than they would next to a real network; with shared memory a step copies
// each row once in each direction at most, and beats the two bare AllToAllV.
//
// # Errors
//
// Arguments are checked before the Comm is touched and reported with errors
// matching [a2a.ErrInvalidArgument] (except a non-finite row with
// [WireFP8], found while quantizing and reported to the peers as described
// there) (wrong buffer sizes, expert ids out of
// range, a decision whose shape does not match the layer, ...); the Comm stays
// usable. The peers, which did not fail, wait in their next collective until
// this rank either retries or closes its Comm (they then see ErrPeerLost or
// ErrAborted), or until their deadline. Failures of the exchanges are the
// Comm's errors (see package a2a); ranks whose layer configurations differ
// fail [New] with an *[a2a.Error] matching [a2a.ErrMismatch] that names the
// other rank, the field and both values ("rank 2 configured another MoE
// layer: Config.Hidden is 16 there, 8 on this rank (rank 0)").
package dispatch
