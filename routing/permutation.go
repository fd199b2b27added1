package routing

// Plan is the send-buffer permutation of one step. Packed row i carries the
// token of assignment Order[i]; rows are grouped by destination rank
// (ascending), within a rank by expert (ascending global id, which is also
// ascending local index), within an expert by token (ascending). Build a Plan
// once and rebuild it every step: Build reuses the storage.
//
// All exported fields are outputs of [Plan.Build]; treat them as read-only.
// After a failed Build the plan is unusable until the next successful one.
type Plan struct {
	// Tokens, K, Experts and Ranks are the shape of the last Build.
	Tokens, K, Experts, Ranks int
	// Rows is the number of packed rows (kept assignments).
	Rows int
	// RankRows[r] is the number of rows sent to rank r.
	RankRows []int
	// RankStart[r] is the first packed row for rank r; RankStart[Ranks] == Rows,
	// so rank r's rows are [RankStart[r], RankStart[r+1]).
	RankStart []int
	// ExpertRows[e] is the number of rows for global expert e.
	ExpertRows []int
	// ExpertStart[e] is the first packed row for global expert e.
	ExpertStart []int
	// Order[i] is the assignment token*K+slot packed at row i.
	Order []int32
	// Weight[i] is the gate weight of packed row i, copied from the Decision
	// so that Combine does not depend on it later.
	Weight []float32
	// Row[token*K+slot] is the packed row of that assignment, or -1 if dropped.
	Row []int32

	placement *Placement
	cursor    []int
}

// Build computes the permutation for d under placement pl. It does not allocate
// once the plan has grown to the problem size.
func (p *Plan) Build(d *Decision, pl *Placement) error {
	if err := pl.Validate(); err != nil {
		return err
	}
	if err := d.check(pl.Experts); err != nil {
		return err
	}
	E, R := pl.Experts, pl.Ranks
	p.Tokens, p.K, p.Experts, p.Ranks, p.placement = d.Tokens, d.K, E, R, pl
	p.RankRows = resizeInts(p.RankRows, R)
	p.RankStart = resizeInts(p.RankStart, R+1)
	p.ExpertRows = resizeInts(p.ExpertRows, E)
	p.ExpertStart = resizeInts(p.ExpertStart, E)
	p.cursor = resizeInts(p.cursor, E)

	clear(p.ExpertRows)
	for _, e := range d.Expert {
		if e != Dropped {
			p.ExpertRows[e]++
		}
	}
	row := 0
	for r, experts := range pl.PerRank {
		p.RankStart[r] = row
		for _, e := range experts {
			p.ExpertStart[e] = row
			row += p.ExpertRows[e]
		}
		p.RankRows[r] = row - p.RankStart[r]
	}
	p.RankStart[R] = row
	p.Rows = row

	if cap(p.Order) < row {
		p.Order = make([]int32, row)
		p.Weight = make([]float32, row)
	}
	p.Order, p.Weight = p.Order[:row], p.Weight[:row]
	n := len(d.Expert)
	if cap(p.Row) < n {
		p.Row = make([]int32, n)
	}
	p.Row = p.Row[:n]

	// Walking assignments in (token, slot) order keeps each expert's rows in
	// token order without sorting.
	copy(p.cursor, p.ExpertStart)
	for i, e := range d.Expert {
		if e == Dropped {
			p.Row[i] = -1
			continue
		}
		r := p.cursor[e]
		p.cursor[e]++
		p.Order[r] = int32(i)
		p.Weight[r] = d.Weight[i]
		p.Row[i] = int32(r)
	}
	return nil
}

// Placement returns the placement of the last Build.
func (p *Plan) Placement() *Placement { return p.placement }

// Token returns the token index of packed row i.
func (p *Plan) Token(i int) int { return int(p.Order[i]) / p.K }

// LocalRows appends to dst the row counts rank r receives for each of its
// local experts, in local-index order (the order they appear in r's segment),
// and returns the extended slice. This is the per-expert header a sender
// transmits with its rows for rank r. r must be in [0, Ranks) of a built plan.
func (p *Plan) LocalRows(r int, dst []int) []int {
	for _, e := range p.placement.PerRank[r] {
		dst = append(dst, p.ExpertRows[e])
	}
	return dst
}

// Pack gathers token rows into send order: dst row i = src row Token(i). src
// holds Tokens rows and dst at least Rows rows, each rowBytes long.
func (p *Plan) Pack(dst, src []byte, rowBytes int) error {
	if rowBytes < 0 {
		return invalidf("row size %d bytes, want >= 0", rowBytes)
	}
	if len(src) < p.Tokens*rowBytes {
		return invalidf("pack source has %d bytes, want >= %d (%d tokens x %d)", len(src), p.Tokens*rowBytes, p.Tokens, rowBytes)
	}
	if len(dst) < p.Rows*rowBytes {
		return invalidf("pack destination has %d bytes, want >= %d (%d rows x %d)", len(dst), p.Rows*rowBytes, p.Rows, rowBytes)
	}
	k := int32(p.K)
	for i, a := range p.Order {
		t := int(a / k)
		copy(dst[i*rowBytes:(i+1)*rowBytes], src[t*rowBytes:(t+1)*rowBytes])
	}
	return nil
}

// Unpack is the byte-level inverse of Pack for rows coming back in packed
// order: dst row token*K+slot = packed row Row[token*K+slot], and dropped slots
// are zeroed. dst holds Tokens*K rows, packed at least Rows rows.
func (p *Plan) Unpack(dst, packed []byte, rowBytes int) error {
	if rowBytes < 0 {
		return invalidf("row size %d bytes, want >= 0", rowBytes)
	}
	if len(dst) < len(p.Row)*rowBytes {
		return invalidf("unpack destination has %d bytes, want >= %d (%d slots x %d)", len(dst), len(p.Row)*rowBytes, len(p.Row), rowBytes)
	}
	if len(packed) < p.Rows*rowBytes {
		return invalidf("unpack source has %d bytes, want >= %d (%d rows x %d)", len(packed), p.Rows*rowBytes, p.Rows, rowBytes)
	}
	for i, r := range p.Row {
		out := dst[i*rowBytes : (i+1)*rowBytes]
		if r < 0 {
			clear(out)
			continue
		}
		copy(out, packed[int(r)*rowBytes:(int(r)+1)*rowBytes])
	}
	return nil
}

// Combine writes into dst, for every token, the gate-weighted sum of its
// expert output rows: dst[t] = sum over kept slots s (in slot order) of
// Weight * packed[Row[t*K+s]]. Rows are hidden float32 values; packed holds at
// least Rows rows in packed order (as returned by the reverse all-to-all) and
// dst at least Tokens rows. A token whose slots were all dropped gets zeros.
func (p *Plan) Combine(dst, packed []float32, hidden int) error {
	if hidden < 0 {
		return invalidf("hidden size %d, want >= 0", hidden)
	}
	if len(dst) < p.Tokens*hidden {
		return invalidf("combine destination has %d values, want >= %d (%d tokens x %d)", len(dst), p.Tokens*hidden, p.Tokens, hidden)
	}
	if len(packed) < p.Rows*hidden {
		return invalidf("combine source has %d values, want >= %d (%d rows x %d)", len(packed), p.Rows*hidden, p.Rows, hidden)
	}
	for t := range p.Tokens {
		out := dst[t*hidden : (t+1)*hidden]
		clear(out)
		for _, r := range p.Row[t*p.K : (t+1)*p.K] {
			if r < 0 {
				continue
			}
			w := p.Weight[r]
			in := packed[int(r)*hidden : (int(r)+1)*hidden]
			for j, v := range in {
				out[j] += w * v
			}
		}
	}
	return nil
}
