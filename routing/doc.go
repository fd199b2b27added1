// Package routing decides where the tokens of one MoE step go and how their rows
// are laid out for the all-to-all. It is pure computation: no networking, no
// goroutines, no package-level state, and only the standard library.
//
// One step flows through four pieces, each reusable across steps so that the
// steady state allocates nothing:
//
//   - [Gate.Route] (or [FromAssignments]) fills a [Decision]: for each of T
//     tokens, K (expert, gate weight) slots.
//   - [Capacity.Apply] drops the lowest-weight assignments of experts that
//     received more than their capacity.
//   - [Plan.Build] turns the Decision and a [Placement] (expert -> rank) into
//     the permutation of the send buffer: rows grouped by destination rank,
//     then by expert, then by token, with per-rank and per-expert counts.
//   - [Plan.Pack] gathers token rows into send order; after the reverse
//     all-to-all returns the expert outputs in the same order, [Plan.Combine]
//     forms the gate-weighted sum back in token order ([Plan.Unpack] is the
//     byte-level inverse of Pack for other element types).
//
// A [Placement] puts experts in physical slots, the same number on every rank
// ([Placement.Slots], [Placement.SlotExpert]). [Contiguous], [FromTable] and
// [Placement.Shrink] give each expert one slot; [FromSlots] takes any slot
// table, and [Balance] computes one from per-expert loads, EPLB's policy: the
// heaviest experts get replicas ([Placement.Replicas]) in redundant slots, and
// the replicas are packed so that every rank carries about the mean load
// ([Placement.RankLoad] estimates it, [Imbalance] rates it), never two
// replicas of one expert on one rank. Plan and Load send each expert's rows
// to one rank, its primary replica (Owner); package dispatch spreads them
// over the replicas (it plans over slots).
//
// Every count is in rows (one row = one kept (token, slot) assignment); callers
// multiply by their row size in bytes. Invalid input is reported with errors
// that match [ErrInvalid], and a2a.ErrInvalidArgument, under errors.Is.
package routing
