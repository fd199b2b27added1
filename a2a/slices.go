package a2a

import (
	"context"

	"github.com/a2a-moe/a2a/a2a/reduce"
)

// Number is an element type the typed helpers accept.
type Number = reduce.Number

// AllReduceSlice is AllReduce on a Go numeric slice (send and recv may be the same slice).
func AllReduceSlice[T Number](ctx context.Context, c *Comm, send, recv []T, op Op) error {
	return c.AllReduce(ctx, reduce.AsBytes(send), reduce.AsBytes(recv), reduce.DTypeOf[T](), op)
}

// ReduceScatterSlice is ReduceScatter on Go numeric slices (len(send) == Size*len(recv)).
func ReduceScatterSlice[T Number](ctx context.Context, c *Comm, send, recv []T, op Op) error {
	return c.ReduceScatter(ctx, reduce.AsBytes(send), reduce.AsBytes(recv), reduce.DTypeOf[T](), op)
}

// ReduceSlice is Reduce on Go numeric slices.
func ReduceSlice[T Number](ctx context.Context, c *Comm, send, recv []T, op Op, root int) error {
	return c.Reduce(ctx, reduce.AsBytes(send), reduce.AsBytes(recv), reduce.DTypeOf[T](), op, root)
}

// AllGatherSlice is AllGather on Go numeric slices (len(recv) == Size*len(send)).
func AllGatherSlice[T Number](ctx context.Context, c *Comm, send, recv []T) error {
	return c.AllGather(ctx, reduce.AsBytes(send), reduce.AsBytes(recv))
}

// BroadcastSlice is Broadcast on a Go numeric slice.
func BroadcastSlice[T Number](ctx context.Context, c *Comm, buf []T, root int) error {
	return c.Broadcast(ctx, reduce.AsBytes(buf), root)
}
