// Agreement of the ranks on one layer: the Config fields every rank must set
// alike, exchanged and compared at New.
package dispatch

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
)

// layerFields is how many fields of a Config agree compares.
const layerFields = 15

// layer returns the fields of the layer every rank must configure alike,
// as agree exchanges them: Experts, K, Hidden, DType, Counts, Rows,
// CapacityFactor (<= 0: unlimited, all alike), the Rebalance settings (not
// its Mover), Wire and KeepFP8 (a sender's wire format is what its
// receivers decode) and a fingerprint of the placement's slot table, replicas
// included: placements with the same primaries but other replicas route
// rows differently; and Hierarchy with whether this rank chose the relay
// path (the cost model's inputs are the same on every rank, but a
// difference would leave the ranks in different collectives).
func (d *Dispatcher) layer() [layerFields]uint64 {
	rb := d.cfg.Rebalance
	return [layerFields]uint64{uint64(d.cfg.Experts), uint64(d.cfg.K), uint64(d.cfg.Hidden), uint64(d.cfg.DType),
		uint64(d.cfg.Counts), uint64(d.cfg.Rows), math.Float64bits(max(d.cfg.CapacityFactor, 0)),
		uint64(rb.Every), math.Float64bits(rb.Threshold), uint64(rb.Redundant),
		uint64(d.cfg.Wire), boolBits(d.cfg.KeepFP8), placementHash(d.pl),
		uint64(d.cfg.Hierarchy) | boolBits(d.hier != nil)<<8, uint64(d.cfg.MaxTokens)}
}

// layerField names field i of layer and shows its value v.
func layerField(i int, v uint64) (name, value string) {
	switch i {
	case 0:
		return "Experts", strconv.FormatUint(v, 10)
	case 1:
		return "K", strconv.FormatUint(v, 10)
	case 2:
		return "Hidden", strconv.FormatUint(v, 10)
	case 3:
		return "DType", reduce.DType(v).String()
	case 4:
		return "Counts", CountsMode(v).String()
	case 5:
		return "Rows", RowPath(v).String()
	case 6:
		return "CapacityFactor", strconv.FormatFloat(math.Float64frombits(v), 'g', -1, 64)
	case 7:
		return "Rebalance.Every", strconv.FormatUint(v, 10)
	case 8:
		return "Rebalance.Threshold", strconv.FormatFloat(math.Float64frombits(v), 'g', -1, 64)
	case 9:
		return "Rebalance.Redundant", strconv.FormatUint(v, 10)
	case 10:
		return "Wire", WireFormat(v).String()
	case 11:
		return "KeepFP8", strconv.FormatBool(v != 0)
	case 13:
		return "Hierarchy", fmt.Sprintf("%v (relay path chosen: %v)", HierarchyMode(v&0xff), v>>8 != 0)
	case 14:
		return "MaxTokens", strconv.FormatUint(v, 10)
	}
	return "Placement", fmt.Sprintf("slot table %#x (fingerprint of every slot's expert, replicas included)", v)
}

// agree checks that every rank configured the same layer: each sends every
// peer its layer's fields and compares what it receives. A difference fails
// with ErrMismatch naming the first rank that differs, the field and both
// values.
func (d *Dispatcher) agree(ctx context.Context) error {
	mine := d.layer()
	const rec = 8 * layerFields
	send, recv := make([]byte, rec*d.size), make([]byte, rec*d.size)
	for j := range d.size {
		for f, v := range mine {
			binary.LittleEndian.PutUint64(send[j*rec+8*f:], v)
		}
	}
	if err := d.comm.AllToAll(ctx, send, recv); err != nil {
		return err
	}
	for i := range d.size {
		for f, v := range mine {
			got := binary.LittleEndian.Uint64(recv[i*rec+8*f:])
			if got == v {
				continue
			}
			name, theirs := layerField(f, got)
			_, ours := layerField(f, v)
			return &a2a.Error{Kind: a2a.ErrMismatch, Rank: i, Detail: fmt.Sprintf(
				"dispatch: rank %d configured another MoE layer: Config.%s is %s there, %s on this rank (rank %d); every rank must pass New the same Config",
				i, name, theirs, ours, d.rank)}
		}
	}
	return nil
}
